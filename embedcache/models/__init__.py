"""Model registry: turn a model name into an adapter with a fully resolved key.

A name is one of

- a built-in floor: ``kmer-1`` .. ``kmer-6``, or ``gc`` (GC fraction; no download);
- a local directory in Hugging Face layout (``config.json`` + tokenizer + weights);
- a hub id ``owner/name``, resolved with ``huggingface_hub`` to a commit sha.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING

from embedcache.errors import (
    AdapterOptionError,
    DeviceUnavailableError,
    UnknownModelError,
)
from embedcache.hashing import files_digest

if TYPE_CHECKING:
    from embedcache.models.base import Adapter

logger = logging.getLogger(__name__)

BUILTIN_MODELS: tuple[str, ...] = (*(f"kmer-{k}" for k in range(1, 7)), "gc")

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# files whose bytes decide a local model's vectors; README, logs, optimizer state do not
_CONTENT_SUFFIXES = frozenset(
    {".json", ".txt", ".model", ".safetensors", ".bin", ".py", ".pt"}
)
# weights in formats the PyTorch adapters never read: skip them when downloading
_HUB_IGNORE = [
    "*.h5",
    "*.msgpack",
    "*.ckpt",
    "*.onnx",
    "*.tflite",
    "*.ot",
    "jax_model/*",
    "*.joblib",
]


def resolve_device(device: str) -> str:
    """Map ``"auto"`` to ``"cuda"`` when a GPU is present, else ``"cpu"``; check the rest.

    Raises
    ------
    DeviceUnavailableError
        A CUDA device is asked for and none is present.
    """
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        msg = f"device {device!r} was requested but CUDA is not available here; use --device cpu or auto"
        raise DeviceUnavailableError(msg)
    try:
        torch.device(device)
    except RuntimeError as err:
        msg = f"unknown device {device!r}; use auto, cpu, cuda or cuda:<index>"
        raise DeviceUnavailableError(msg) from err
    return device


def local_revision(path: Path) -> str:
    """``"sha256:<hex>"`` over the names and bytes of a model directory's content files."""
    files = [
        p
        for p in path.rglob("*")
        if p.is_file() and p.suffix in _CONTENT_SUFFIXES and ".cache" not in p.parts
    ]
    return files_digest(path, files)


def resolve_hub_model(repo_id: str, *, revision: str | None = None) -> tuple[Path, str]:
    """Download (or find in the local cache) a hub model; return its folder and commit sha.

    Raises
    ------
    UnknownModelError
        The repository or revision does not exist, or the hub is unreachable and the
        model is not in the local cache.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
    )

    try:
        folder = Path(
            snapshot_download(repo_id, revision=revision, ignore_patterns=_HUB_IGNORE)
        )
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as err:
        msg = (
            f"model {repo_id!r}{f' at revision {revision}' if revision else ''} is not in the "
            "local Hugging Face cache and the hub cannot be reached (offline). Download it on a "
            "connected machine, copy the cache (HF_HOME), or pass a local directory instead."
        )
        raise UnknownModelError(msg) from err
    except (HfHubHTTPError, OSError, ValueError) as err:
        msg = f"cannot fetch model {repo_id!r} (revision {revision or 'default'}) from the hub: {err}"
        raise UnknownModelError(msg) from err
    commit = folder.name  # snapshots/<commit sha>/
    if not _COMMIT.match(commit):
        msg = f"hub snapshot folder {folder} is not named by a commit sha; cannot pin {repo_id!r}"
        raise UnknownModelError(msg)
    return folder, commit


def _unknown_model(model: str, reason: str) -> UnknownModelError:
    msg = (
        f"unknown model {model!r}: {reason}. A model is a built-in name "
        f"({', '.join(BUILTIN_MODELS)}), a local directory in Hugging Face layout "
        "(config.json, tokenizer, weights), or a hub id such as 'owner/name'."
    )
    return UnknownModelError(msg)


def load_adapter(
    model: str,
    *,
    revision: str | None = None,
    dtype: str = "float32",
    device: str = "auto",
    rc_mode: str | None = None,
    layer: int = -1,
    special_tokens: str = "exclude",
    truncation: str = "error",
    kmer_split: int | None = None,
    trust_remote_code: bool = False,
) -> Adapter:
    """Build the adapter for ``model`` with every option resolved into its key.

    Parameters
    ----------
    model
        Built-in name, local directory, or hub id.
    revision
        Hub revision (branch, tag or commit); recorded as the resolved commit sha.
        Not allowed for built-ins and local directories (their revision is computed).
    rc_mode
        None: the family's default (``"average"`` for Caduceus, ``"none"`` otherwise).

    Raises
    ------
    UnknownModelError
        The name is none of the three kinds, or the model cannot be found or loaded.
    AdapterOptionError
        An option does not apply to this model.
    """
    if model in BUILTIN_MODELS:
        return _load_builtin(
            model,
            revision=revision,
            rc_mode=rc_mode,
            layer=layer,
            kmer_split=kmer_split,
            truncation=truncation,
        )
    path = Path(model).expanduser()
    if path.is_dir():
        content = local_revision(path)
        if revision is not None and revision != content:
            msg = (
                f"--revision {revision!r} was given for the local directory {path}, whose "
                f"content digest is {content}; drop --revision for local models"
            )
            raise AdapterOptionError(msg)
        model_type = _local_model_type(path)
        model_type_from_dir = True
        # the content digest pins the model; the folder name keeps keys readable and
        # lets a moved or copied directory keep its cache
        source, model_id, resolved = path, path.resolve().name, content
    elif _HUB_ID.match(model) and not path.exists():
        model_type = "caduceus" if "caduceus" in model.lower() else None
        model_type_from_dir = False
        try:
            source, resolved = resolve_hub_model(model, revision=revision)
        except UnknownModelError as err:
            err.add_note(f"no local directory {model!r} exists either")
            raise
        model_id = model
        if model_type is None:
            model_type = _local_model_type(source)
    else:
        if path.exists():
            reason = "it is a file, not a model directory"
        elif model.startswith(("kmer", "k-mer")):
            reason = "built-in k-mer models are kmer-1 .. kmer-6"
        elif "/" in model or model.startswith((".", "~")):
            reason = "no such directory, and it is not a hub id of the form owner/name"
        else:
            reason = "not a built-in name, an existing directory, or a hub id"
        raise _unknown_model(model, reason)

    device = resolve_device(device)
    if model_type == "caduceus":
        # imported here: the Caduceus family pulls in its own (optional) kernels
        from embedcache.models.caduceus import load_caduceus_adapter

        if layer != -1 or special_tokens != "exclude" or kmer_split is not None:
            msg = f"{model}: Caduceus adapters take no --layer, --include-special-tokens or --kmer-split"
            raise AdapterOptionError(msg)
        return load_caduceus_adapter(
            source if model_type_from_dir else model,
            revision=resolved,
            rc_mode=rc_mode or "average",
            dtype=dtype,
            device=device,
        )

    from embedcache.models.hf import HFEncoderAdapter

    return HFEncoderAdapter(
        source,
        model_id=model_id,
        revision=resolved,
        dtype=dtype,
        device=device,
        layer=layer,
        special_tokens=special_tokens,
        truncation=truncation,
        kmer_split=kmer_split,
        rc_mode=rc_mode or "none",
        trust_remote_code=trust_remote_code,
    )


def _load_builtin(
    model: str,
    *,
    revision: str | None,
    rc_mode: str | None,
    layer: int,
    kmer_split: int | None,
    truncation: str,
) -> Adapter:
    from embedcache.models.kmer import KmerAdapter

    if model == "gc":
        return _load_gc(
            revision=revision,
            rc_mode=rc_mode,
            layer=layer,
            kmer_split=kmer_split,
            truncation=truncation,
        )
    if revision is not None:
        msg = (
            f"{model} is built in; its revision is the adapter version, drop --revision"
        )
        raise AdapterOptionError(msg)
    if layer != -1 or kmer_split is not None:
        msg = f"{model} is a k-mer spectrum: --layer and --kmer-split do not apply"
        raise AdapterOptionError(msg)
    if truncation != "error":
        msg = f"{model} accepts sequences of any length: --truncate does not apply"
        raise AdapterOptionError(msg)
    # dtype and device are ignored: counting k-mers is exact and runs in numpy
    return KmerAdapter(int(model.split("-")[1]), rc_mode=rc_mode or "none")


def _load_gc(
    *,
    revision: str | None,
    rc_mode: str | None,
    layer: int,
    kmer_split: int | None,
    truncation: str,
) -> Adapter:
    from embedcache.models.gc import GCAdapter

    if revision is not None:
        msg = "gc is built in; its revision is the adapter version, drop --revision"
        raise AdapterOptionError(msg)
    if layer != -1 or kmer_split is not None:
        msg = (
            "gc is the GC fraction of a sequence: --layer and --kmer-split do not apply"
        )
        raise AdapterOptionError(msg)
    if truncation != "error":
        msg = "gc accepts sequences of any length: --truncate does not apply"
        raise AdapterOptionError(msg)
    # dtype and device are ignored: counting bases is exact and runs in numpy
    return GCAdapter(rc_mode=rc_mode or "none")


def _local_model_type(path: Path) -> str | None:
    config = path / "config.json"
    if not config.is_file():
        msg = (
            f"{path} has no config.json; a local model must be a directory in Hugging Face "
            "layout (save_pretrained output)"
        )
        raise UnknownModelError(msg)
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        msg = f"cannot read {config}: {err}"
        raise UnknownModelError(msg) from err
    return data.get("model_type")


__all__ = [
    "BUILTIN_MODELS",
    "load_adapter",
    "local_revision",
    "resolve_device",
    "resolve_hub_model",
]
