"""Model registry: turn a model name into an adapter with a fully resolved key.

A name is one of

- a built-in floor: ``kmer-1`` .. ``kmer-6``, or ``gc`` (GC fraction; no download);
- a local directory in Hugging Face layout (``config.json`` + tokenizer + weights);
- a hub id ``owner/name``, resolved with ``huggingface_hub`` to a commit sha.

A checkpoint's family is recognised from its ``config.json`` in one place,
:func:`recognise_family`, over :data:`FAMILY_MODULES` (the one family dispatch): each
family's ``families/<name>/adapter.py`` says whether a config is its own
(``recognise``) and builds the adapter from a
:class:`~embedcache.models.shared.checkpoint.Source` (``load``). No repository code
ever runs unless the checkpoint is none of these families and the user opts in.

Imports the bottom floor, ``options``, ``shared.checkpoint`` and
``shared.cpu_features`` (none imports torch); families and floors load only when a
name needs them.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import re
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from embedcache.errors import (
    AdapterOptionError,
    DeviceUnavailableError,
    UnknownModelError,
)
from embedcache.hashing import files_digest
from embedcache.models.options import LAST_LAYER, EmbedOptions
from embedcache.models.shared.checkpoint import Source
from embedcache.models.shared.cpu_features import (
    AUTO,
    describe_auto,
    resolve_dtype,
    warn_if_bf16_is_slow,
)

if TYPE_CHECKING:
    from embedcache.models.base import Adapter

logger = logging.getLogger(__name__)

BUILTIN_MODELS: tuple[str, ...] = (*(f"kmer-{k}" for k in range(1, 7)), "gc")
# Families (embedcache/models/families/<name>/), most specific first; "hf" (native
# transformers classes) is the fallback. Each adapter module has FAMILY,
# recognise(config, folder) and load(source: Source).
FAMILY_MODULES: tuple[str, ...] = (
    "caduceus",
    "generator",
    "dnabert2",
    "hyena",
    "ntv2",
    "gena",
    "hf",
)
# the model id of every local directory: its content digest (the revision) is its
# identity, its folder name only a display alias kept beside the key
LOCAL_MODEL_ID = "local"
# Architectures shipped as a config without weights (embedcache/models/architectures/): only
# a random-init twin can be built from them; the name is the key's model id.
ARCHITECTURES_DIR = Path(__file__).resolve().parent / "architectures"
BUILTIN_ARCHITECTURES: tuple[str, ...] = ("caduceus-tiny",)

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# files whose bytes decide a local model's vectors; README, logs, optimizer state do not
_CONTENT_SUFFIXES = frozenset(
    {".json", ".txt", ".model", ".safetensors", ".bin", ".py", ".pt"}
)
# what a hub snapshot needs: configs, tokenizer files, code (read, never run unasked)
_HUB_FILES = ["*.json", "*.txt", "*.model", "*.py", "*.tiktoken"]
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


def _hub_patterns(repo_id: str, revision: str | None) -> list[str] | None:
    """Files to fetch: configs, tokenizer and one weight format (safetensors when the
    repository has it, else the pickles), or None when the file list is unreachable
    (offline: the cached snapshot is used as it is)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    try:
        files = HfApi().list_repo_files(repo_id, revision=revision)
    except (HfHubHTTPError, OSError, ValueError):
        return None  # offline, private or unknown: snapshot_download says which
    if any(f.endswith(".safetensors") for f in files):
        weights = ["*.safetensors", "*.safetensors.index.json"]
    else:
        weights = ["*.bin", "*.bin.index.json"]
    return _HUB_FILES + weights


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

    patterns = _hub_patterns(repo_id, revision)
    try:
        folder = Path(
            snapshot_download(
                repo_id,
                revision=revision,
                allow_patterns=patterns,
                ignore_patterns=_HUB_IGNORE if patterns is None else None,
            )
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


def read_config(folder: Path) -> dict[str, Any]:
    """A model folder's ``config.json`` as a dict.

    Raises
    ------
    UnknownModelError
        The folder has no readable ``config.json``.
    """
    config = folder / "config.json"
    if not config.is_file():
        msg = (
            f"{folder} has no config.json; a local model must be a directory in Hugging "
            "Face layout (save_pretrained output)"
        )
        raise UnknownModelError(msg)
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        msg = f"cannot read {config}: {err}"
        raise UnknownModelError(msg) from err
    if not isinstance(data, dict):
        msg = f"{config} is not a JSON object"
        raise UnknownModelError(msg)
    return data


def family_module(name: str) -> ModuleType:
    """The family's adapter module ``embedcache.models.families.<name>.adapter``."""
    return importlib.import_module(f"embedcache.models.families.{name}.adapter")


def describe_config(config: dict[str, Any]) -> str:
    """``model_type``, ``architectures`` and ``auto_map`` of a config, for messages."""
    parts = [
        f"model_type {config.get('model_type')!r}",
        f"architectures {config.get('architectures')}",
    ]
    if config.get("auto_map"):
        parts.append(f"auto_map {config['auto_map']}")
    return ", ".join(parts)


def recognise_family(
    config: dict[str, Any], folder: Path, *, trust_remote_code: bool = False
) -> ModuleType:
    """The family module that loads this checkpoint, decided from its config alone.

    Raises
    ------
    UnknownModelError
        The checkpoint needs its repository's own code and is none of embedcache's
        families (and ``trust_remote_code`` is off), or it names no model type at all.
    """
    for name in FAMILY_MODULES[:-1]:
        module = family_module(name)
        if module.recognise(config, folder):
            return module
    fallback = family_module(FAMILY_MODULES[-1])
    if config.get("auto_map") and not trust_remote_code:
        known = ", ".join(FAMILY_MODULES[:-1])
        msg = (
            f"{folder} needs its repository's own code ({describe_config(config)}) and is "
            f"none of the families embedcache loads without remote code ({known}, plus "
            "native transformers classes). Running the repository's code is your own "
            "opt-in: pass --trust-remote-code if you trust it."
        )
        raise UnknownModelError(msg)
    if not config.get("model_type") and not config.get("auto_map"):
        msg = (
            f"{folder}/config.json names no model_type ({describe_config(config)}); "
            "embedcache cannot tell which architecture it is"
        )
        raise UnknownModelError(msg)
    return fallback


def load_adapter(
    model: str,
    *,
    revision: str | None = None,
    **options: Any,  # noqa: ANN401
) -> Adapter:
    """Build the adapter for ``model`` with every option resolved into its key.

    Parameters
    ----------
    model
        Built-in name, local directory, or hub id.
    revision
        Hub revision (branch, tag or commit); recorded as the resolved commit sha.
        Not allowed for built-ins and local directories (their revision is computed).
    **options
        Fields of :class:`~embedcache.models.options.EmbedOptions` (dtype, device,
        rc_mode, layers, pooling, special_tokens, truncation, kmer_split, random_init,
        family_options, trust_remote_code).

    Raises
    ------
    UnknownModelError
        The name is none of the three kinds, or the model cannot be found or loaded.
    AdapterOptionError
        An option does not apply to this model.
    """
    try:
        opts = EmbedOptions(**options)
    except TypeError as err:
        msg = f"{model}: {err}"
        raise AdapterOptionError(msg) from err
    if model in BUILTIN_MODELS:
        return _load_builtin(model, revision=revision, options=opts)
    if model in BUILTIN_ARCHITECTURES and opts.random_init is None:
        msg = (
            f"{model} is a shipped architecture without trained weights; build its "
            "random-init control with --random-init SEED"
        )
        raise AdapterOptionError(msg)
    folder, model_id, resolved, alias = _resolve_source(model, revision=revision)
    config = read_config(folder)
    family = recognise_family(config, folder, trust_remote_code=opts.trust_remote_code)
    logger.debug("%s: recognised as %s", model, family.FAMILY)
    device = resolve_device(opts.device)
    if opts.dtype == AUTO:  # the key records what runs
        logger.info("%s: %s", model, describe_auto(device))
        opts = dataclasses.replace(opts, dtype=resolve_dtype(AUTO, device))
    warn_if_bf16_is_slow(opts.dtype, device, model=model)
    source = Source(
        folder=folder,
        config=config,
        model_id=model_id,
        revision=resolved,
        options=opts,
        device=device,
        alias=alias,
    )
    return family.load(source)


def _resolve_source(
    model: str, *, revision: str | None
) -> tuple[Path, str, str, str | None]:
    """(folder, model id, resolved revision, display alias) of a local dir or hub id."""
    if model in BUILTIN_ARCHITECTURES:
        folder = ARCHITECTURES_DIR / model
        if revision is not None:
            msg = f"{model} is a shipped config; drop --revision"
            raise AdapterOptionError(msg)
        return folder, model, local_revision(folder), None
    path = Path(model).expanduser()
    if path.is_dir():
        content = local_revision(path)
        if revision is not None and revision != content:
            msg = (
                f"--revision {revision!r} was given for the local directory {path}, whose "
                f"content digest is {content}; drop --revision for local models"
            )
            raise AdapterOptionError(msg)
        # the content digest is the identity; the folder name is only a display alias,
        # so a renamed or moved byte-identical copy hits the same cache
        return path, LOCAL_MODEL_ID, content, path.resolve().name
    if _HUB_ID.match(model) and not path.exists():
        try:
            folder, commit = resolve_hub_model(model, revision=revision)
        except UnknownModelError as err:
            err.add_note(f"no local directory {model!r} exists either")
            raise
        return folder, model, commit, None
    if path.exists():
        reason = "it is a file, not a model directory"
    elif model.startswith(("kmer", "k-mer")):
        reason = "built-in k-mer models are kmer-1 .. kmer-6"
    elif "/" in model or model.startswith((".", "~")):
        reason = "no such directory, and it is not a hub id of the form owner/name"
    else:
        reason = "not a built-in name, an existing directory, or a hub id"
    raise _unknown_model(model, reason)


def layer_count(model: str, *, revision: str | None = None) -> int:
    """Blocks of a model's architecture, read from its config (no weights loaded).

    What ``--layers all`` expands to: -1 (the last layer, the protocol's) and the
    embedding output 0 and every block 1..n-1 (block n's output is the last layer
    itself, or the stream before the final norm). Raises for built-in floors.
    """
    if model in BUILTIN_MODELS:
        msg = f"{model} is a built-in floor without layers; --layers does not apply"
        raise AdapterOptionError(msg)
    folder, *_ = _resolve_source(model, revision=revision)
    config = read_config(folder)
    for field in ("num_hidden_layers", "n_layer", "num_layers", "n_layers"):
        value = config.get(field)
        if isinstance(value, int) and value > 0:
            return value
    msg = f"{folder}/config.json names no layer count ({describe_config(config)})"
    raise UnknownModelError(msg)


def parse_layers(
    spec: str | None,
    *,
    layer: int = LAST_LAYER,
    model: str,
    revision: str | None = None,
) -> tuple[int, ...]:
    """The layers of ``--layer L`` or ``--layers all|L1,L2,...`` (all: -1, then 0..n-1).

    ``all`` reads the model's layer count from its config (no weights loaded).

    Raises
    ------
    AdapterOptionError
        Both a layer and a spec, a spec that is not ``all`` or a comma list of
        integers, or ``all`` for a model without layers.
    """
    if spec is None:
        return (layer,)
    if layer != LAST_LAYER:
        msg = "give --layer or --layers, not both"
        raise AdapterOptionError(msg)
    if spec.strip().lower() == "all":
        n = layer_count(model, revision=revision)
        return (LAST_LAYER, *range(n))
    try:
        layers = tuple(int(part) for part in spec.split(",") if part.strip())
    except ValueError as err:
        msg = f"--layers {spec!r} is not 'all' or a comma list of integers like 2,6,12"
        raise AdapterOptionError(msg) from err
    if not layers:
        msg = "--layers names no layer"
        raise AdapterOptionError(msg)
    return layers


# what each built-in floor is, for messages about options that do not apply to it
_BUILTIN_WHAT = {"kmer": "a k-mer spectrum", "gc": "the GC fraction of a sequence"}


def _load_builtin(
    model: str, *, revision: str | None, options: EmbedOptions
) -> Adapter:
    from embedcache.models.shared.checkpoint import refuse_options

    if revision is not None:
        msg = (
            f"{model} is built in; its revision is the adapter version, drop --revision"
        )
        raise AdapterOptionError(msg)
    if options.truncation != "error":
        msg = f"{model} accepts sequences of any length: --truncate does not apply"
        raise AdapterOptionError(msg)
    names = ("layers", "kmer_split", "pooling", "special_tokens", "random_init")
    what = _BUILTIN_WHAT["gc" if model == "gc" else "kmer"]
    refuse_options(
        options,
        (*names, "family_options"),
        before=f"{model} is {what}: ",
        after=" do(es) not apply",
    )
    # dtype and device are ignored: counting bases and k-mers is exact, in numpy
    if model == "gc":
        from embedcache.models.floors.gc_content import GCAdapter

        return GCAdapter(rc_mode=options.rc_mode or "none")
    from embedcache.models.floors.kmer import KmerAdapter

    return KmerAdapter(int(model.split("-")[1]), rc_mode=options.rc_mode or "none")
