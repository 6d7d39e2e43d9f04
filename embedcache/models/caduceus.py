"""Caduceus-ph and Caduceus-ps in pure PyTorch: official checkpoints, no ``mamba_ssm``.

Loads the official checkpoints (kuleshov-group/caduceus-{ph,ps}_*; ``config.json`` +
``model.safetensors`` or ``pytorch_model.bin``) into :mod:`._caduceus_model`, without
remote code and without network when the files are local. On CPU the selective scan
runs in a compiled numba kernel; on CUDA in torch ops.

Tokens are the sequence's characters, no special tokens (the official tokenizer with
``add_special_tokens=False``): A7 C8 G9 T10 N11, anything else [UNK]6. The vector is the
mean over tokens of the final-norm output. RC modes:

- ``none``: the forward strand only; ps keeps all 2 x d_model channels;
- ``average`` (default): ph averages the pooled passes over the sequence and its reverse
  complement (run as one batch); ps averages its first half with its channel-flipped
  second half (one pass: the model computes both strands).

There is no attention mask, so only sequences of equal length share a forward pass;
``embed_batch`` groups any input by length itself, and ``needs_equal_lengths`` tells
the engine to hand it equal lengths to begin with.
"""

from __future__ import annotations

import json
import logging
import os
import re
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from embedcache.errors import (
    AdapterOptionError,
    CheckpointError,
    InvalidSequenceError,
    UnknownModelError,
)
from embedcache.hashing import files_digest, reverse_complement
from embedcache.jitcache import CompileNotice
from embedcache.models import resolve_device
from embedcache.models._caduceus_model import (
    BASE_IDS,
    UNK_ID,
    CaduceusBackbone,
    arch_from_config,
    complement_ids,
    weights_from_state_dict,
)
from embedcache.specs import ModelKey

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

logger = logging.getLogger(__name__)

CADUCEUS_ADAPTER_VERSION = "1"
DTYPES = ("float32", "bfloat16")
RC_MODES = ("average", "none")
SCANS = ("auto", "numba", "torch")
# tokens per forward pass (copies for the RC strand included): bounds activation memory
# (~40 KB per token at d_model 256) while keeping the matmuls large
_TOKENS_PER_PASS = 16384
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_KERNEL_MODULE = "embedcache.models._caduceus_numba"


def _token_table() -> np.ndarray:
    table = np.full(256, UNK_ID, dtype=np.int64)
    for base, token in BASE_IDS.items():
        # the official tokenizer upper-cases before the lookup
        table[ord(base)] = token
        table[ord(base.lower())] = token
    return table


_TOKENS = _token_table()


def tokenize(seq: str) -> np.ndarray:
    """Official Caduceus token ids of ``seq`` without special tokens (int64)."""
    raw = np.frombuffer(seq.encode("latin-1", errors="replace"), dtype=np.uint8)
    return _TOKENS[raw]


def is_caduceus_config(config: dict) -> bool:
    """Whether a ``config.json`` dict describes a Caduceus model."""
    if config.get("model_type") == "caduceus":
        return True
    return any(
        "caduceus" in str(name).lower() for name in config.get("architectures") or ()
    )


class CaduceusAdapter:
    """Mean-pooled Caduceus embeddings; satisfies :class:`embedcache.models.base.Adapter`.

    Build it with :func:`load_caduceus_adapter`.
    """

    needs_equal_lengths = True
    max_tokens: int | None = None
    # batches the engine hands over (sequence tokens; the RC pass doubles them): at
    # 500 bp, 24-sequence calls ran 1.6-1.9x faster than 3-sequence ones (the engine
    # default), as the matmuls grow and per-call kernel overhead shrinks
    preferred_token_budget = 8192

    def __init__(self, backbone: CaduceusBackbone, *, key: ModelKey) -> None:
        self.backbone = backbone
        self.key = key
        d = backbone.arch.d_model
        self.dim = 2 * d if backbone.arch.rcps and key.rc_mode == "none" else d
        self.max_tokens = key.max_length
        # a first run on a machine compiles the numba kernels for 20-40 s: say so once
        self._compile_notice = (
            CompileNotice(modules=[_KERNEL_MODULE], what="Caduceus CPU kernels (numba)")
            if backbone.kernels == "numba"
            else None
        )

    def n_tokens(self, seq: str) -> int:
        """One token per base: no special tokens are added."""
        return len(seq)

    def n_tokens_many(self, seqs: Sequence[str]) -> list[int]:
        """:meth:`n_tokens` of every sequence."""
        return [len(seq) for seq in seqs]

    def embed_batch(self, seqs: Sequence[str]) -> np.ndarray:
        """Float32 vectors (len(seqs), dim), in order; equal lengths run together.

        Raises
        ------
        InvalidSequenceError
            A sequence is empty (its mean over tokens is undefined).
        """
        import torch

        out = np.empty((len(seqs), self.dim), dtype=np.float32)
        by_length: dict[int, list[int]] = {}
        for i, seq in enumerate(seqs):
            if not seq:
                msg = f"sequence {i} of the batch is empty; Caduceus needs at least one base"
                raise InvalidSequenceError(msg)
            by_length.setdefault(len(seq), []).append(i)
        if self.key.rc_mode == "average":
            # either strand gives the same vector in exact arithmetic; computing from a
            # canonical strand makes it the same to the last bit as well
            seqs = [min(seq, reverse_complement(seq)) for seq in seqs]
        copies = 2 if (self.backbone.arch.rcps or self.key.rc_mode == "average") else 1
        watch = self._compile_notice.watch() if self._compile_notice else nullcontext()
        with watch, torch.inference_mode():
            for length, idx in by_length.items():
                step = max(1, _TOKENS_PER_PASS // (length * copies))
                for start in range(0, len(idx), step):
                    part = idx[start : start + step]
                    ids = torch.from_numpy(np.stack([tokenize(seqs[i]) for i in part]))
                    out[part] = (
                        self._embed_ids(ids.to(self.backbone.device)).cpu().numpy()
                    )
        return out

    def _embed_ids(self, ids: torch.Tensor) -> torch.Tensor:
        import torch

        arch = self.backbone.arch
        if arch.rcps:
            pooled = self.backbone.pooled(ids)
            if self.key.rc_mode == "none":
                return pooled
            d = arch.d_model
            return (pooled[:, :d] + pooled[:, d:].flip(dims=(-1,))) / 2
        if self.key.rc_mode == "none":
            return self.backbone.pooled(ids)
        n = ids.shape[0]
        pooled = self.backbone.pooled(torch.cat([ids, complement_ids(ids)]))
        return (pooled[:n] + pooled[n:]) / 2

    def __repr__(self) -> str:
        return f"CaduceusAdapter({self.key.short()}, dim={self.dim})"


def load_caduceus_adapter(
    source: str | os.PathLike,
    *,
    revision: str | None = None,
    rc_mode: str = "average",
    dtype: str = "float32",
    device: str = "cpu",
    scan: str = "auto",
) -> CaduceusAdapter:
    """Load an official-layout Caduceus checkpoint as an adapter.

    Parameters
    ----------
    source
        A local directory in hub layout (``config.json`` + ``model.safetensors``, or
        ``pytorch_model.bin``, read with ``weights_only=True``) or a hub id.
    revision
        Hub ids: branch, tag or commit, recorded as the resolved commit sha. Local
        directories: their revision is ``"sha256:"`` + a digest of the config and
        weight files; a ``sha256:`` digest passed here is superseded by it.
    rc_mode
        ``"average"`` (default) or ``"none"``.
    dtype
        ``"float32"``, or ``"bfloat16"`` for the in/out projections (the scan state,
        norms and residual stream stay float32).
    device
        ``"cpu"``, ``"cuda"`` / ``"cuda:<i>"``, or ``"auto"``.
    scan
        ``"auto"`` (numba kernel on CPU, torch on CUDA), ``"numba"`` or ``"torch"``.

    Raises
    ------
    UnknownModelError
        No such directory, or a hub id that cannot be resolved (offline, not cached).
    CheckpointError
        The weights are missing, incomplete or do not fit the config.
    AdapterOptionError
        An option is not one of the allowed values.
    DeviceUnavailableError
        CUDA is requested but not available.
    """
    import torch

    if rc_mode not in RC_MODES:
        msg = f"rc_mode {rc_mode!r} is not one of {RC_MODES} for Caduceus"
        raise AdapterOptionError(msg)
    if dtype not in DTYPES:
        msg = f"dtype {dtype!r} is not one of {DTYPES} for Caduceus"
        raise AdapterOptionError(msg)
    if scan not in SCANS:
        msg = f"scan {scan!r} is not one of {SCANS}"
        raise AdapterOptionError(msg)
    device = resolve_device(device)
    on_cuda = device.startswith("cuda")
    if scan == "numba" and on_cuda:
        msg = "scan='numba' runs on CPU tensors only; use scan='torch' or 'auto' with CUDA"
        raise AdapterOptionError(msg)

    folder, model_id, resolved = _resolve_source(source, revision=revision)
    config_path = folder / "config.json"
    config = _read_config(config_path)
    if not is_caduceus_config(config):
        msg = (
            f"{config_path} has model_type {config.get('model_type')!r}, not 'caduceus'"
        )
        raise CheckpointError(msg)
    weight_path = _weight_file(folder)
    if resolved is None:
        resolved = files_digest(folder, [config_path, weight_path])
        if revision is not None and revision != resolved:
            if not revision.startswith("sha256:"):
                msg = (
                    f"revision {revision!r} was given for the local directory {folder}; a local "
                    f"model's revision is its content digest ({resolved}); drop the revision"
                )
                raise AdapterOptionError(msg)
            logger.debug(
                "%s: recording the adapter's digest %s instead of %s",
                folder,
                resolved,
                revision,
            )

    arch = arch_from_config(config, where=str(config_path))
    weights = weights_from_state_dict(
        arch, _read_state_dict(weight_path), config=config, where=str(weight_path)
    )
    use_numba = scan == "numba" or (scan == "auto" and not on_cuda)
    backbone = CaduceusBackbone(
        arch,
        weights,
        device=device,
        matmul_dtype=torch.bfloat16 if dtype == "bfloat16" else torch.float32,
        kernels="numba" if use_numba else "torch",
    )
    max_length = config.get("max_length") or config.get("max_position_embeddings")
    key = ModelKey(
        model_id=model_id,
        revision=resolved,
        adapter="caduceus",
        adapter_version=CADUCEUS_ADAPTER_VERSION,
        layer=-1,
        pooling="mean",
        special_tokens="none",
        rc_mode=rc_mode,
        dtype=dtype,
        max_length=int(max_length) if max_length else None,
    )
    logger.info(
        "loaded Caduceus-%s (d_model %d, %d layers) from %s on %s, scan %s",
        "ps" if arch.rcps else "ph",
        arch.d_model,
        arch.n_layer,
        folder,
        device,
        "numba" if use_numba else "torch",
    )
    return CaduceusAdapter(backbone, key=key)


def _resolve_source(
    source: str | os.PathLike, *, revision: str | None
) -> tuple[Path, str, str | None]:
    """(folder, model id, commit sha or None for a local dir whose digest is computed later)."""
    text = os.fspath(source)
    path = Path(text).expanduser()
    if path.is_dir():
        # the folder name, as for other local models: a moved copy keeps its cache
        return path, path.resolve().name, None
    if path.exists() or not _HUB_ID.match(text):
        msg = (
            f"Caduceus model {text!r} is neither a local directory (config.json + weights) "
            "nor a hub id of the form owner/name"
        )
        raise UnknownModelError(msg)
    folder = _snapshot(
        text, revision=revision, patterns=["config.json", "model.safetensors"]
    )
    if not (folder / "model.safetensors").is_file():
        folder = _snapshot(
            text, revision=revision, patterns=["config.json", "pytorch_model.bin"]
        )
    commit = folder.name  # .../snapshots/<commit sha>
    if not _COMMIT.match(commit):
        msg = f"hub snapshot folder {folder} is not named by a commit sha; cannot pin {text!r}"
        raise UnknownModelError(msg)
    return folder, text, commit


def _snapshot(repo_id: str, *, revision: str | None, patterns: list[str]) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(repo_id, revision=revision, allow_patterns=patterns)
        )
    except Exception as err:  # hub errors vary by version: offline, 404, network
        msg = (
            f"cannot resolve Caduceus model {repo_id!r} (revision {revision or 'default'}) from "
            f"the hub or the local cache: {err}. Download it on a connected machine or pass "
            "a local directory."
        )
        raise UnknownModelError(msg) from err


def _read_config(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        msg = f"{path.parent} has no config.json; a Caduceus model directory needs one"
        raise CheckpointError(msg) from err
    except (OSError, json.JSONDecodeError) as err:
        msg = f"cannot read {path}: {err}"
        raise CheckpointError(msg) from err


def _weight_file(folder: Path) -> Path:
    for name in _WEIGHT_FILES:
        if (folder / name).is_file():
            return folder / name
    msg = f"{folder} holds none of {', '.join(_WEIGHT_FILES)}; save the model with save_pretrained"
    raise CheckpointError(msg)


def _read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    import torch

    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path), device="cpu")
        # weights_only: a pickle from the internet must not run code
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # safetensors and pickle raise many types on a bad file
        msg = f"cannot read the weights in {path}: {err}"
        raise CheckpointError(msg) from err
