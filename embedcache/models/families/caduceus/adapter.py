"""Caduceus-ph and Caduceus-ps in pure PyTorch: official checkpoints, no ``mamba_ssm``.

Loads the official checkpoints (kuleshov-group/caduceus-{ph,ps}_*; ``config.json`` +
``model.safetensors`` or ``pytorch_model.bin``) into :mod:`.network`, without
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

import logging
import os
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
from embedcache.hashing import reverse_complement
from embedcache.models.families.caduceus.init import random_weights
from embedcache.models.families.caduceus.network import CaduceusBackbone, complement_ids
from embedcache.models.families.caduceus.weights import (
    arch_from_config,
    weights_from_state_dict,
)
from embedcache.models.options import EmbedOptions
from embedcache.models.registry import resolve_device
from embedcache.models.shared.char_tokens import lookup, token_table
from embedcache.models.shared.checkpoint import (
    Source,
    compute_dtype,
    random_init_twin,
    refuse_options,
)
from embedcache.models.shared.jitcache import CompileNotice
from embedcache.models.shared.weights import read_state_dict
from embedcache.specs import ModelKey

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

    from embedcache.models.families.caduceus.weights import CaduceusArch

logger = logging.getLogger(__name__)

# 2: the tuner may pick the fused scan (issue 43), whose cheaper exps change float32
# bits (within 2e-6 relative of version 1's); a new key, so no store mixes the two.
# 3: the fused scan gates the directions' sum once, and the projections may run
# through oneDNN (shared.linear): other float32 bits again, within the tolerance
# 4, bfloat16 keys only: the fused scan's decay is degree 3 for a bfloat16 output
# (vectors within bfloat16 rounding of 3's); float32 vectors did not move, nor
# their keys
CADUCEUS_ADAPTER_VERSION = "3"
CADUCEUS_BF16_ADAPTER_VERSION = "4"
RC_MODES = ("average", "none")
SCANS = ("auto", "numba", "torch")
# tokens per forward pass (copies for the RC strand included): bounds activation memory
# (~40 KB per token at d_model 256) while keeping the matmuls large
_TOKENS_PER_PASS = 16384
_KERNEL_MODULE = "embedcache.models.families.caduceus.kernels"


# the official tokenizer upper-cases before the lookup
_TOKENS = token_table(lower=True)


def tokenize(seq: str) -> np.ndarray:
    """Official Caduceus token ids of ``seq`` without special tokens (int64)."""
    return lookup(_TOKENS, seq)


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

    def __init__(
        self,
        backbone: CaduceusBackbone,
        *,
        key: ModelKey | None = None,
        keys: tuple[ModelKey, ...] = (),
        alias: str | None = None,
    ) -> None:
        self.backbone = backbone
        # one key per requested layer (a layer sweep fills them from one forward pass)
        self.keys = keys or ((key,) if key is not None else ())
        if not self.keys:
            msg = "a Caduceus adapter needs a key"
            raise AdapterOptionError(msg)
        self.key = self.keys[0]
        self.layers = tuple(k.layer for k in self.keys)
        self.alias = alias
        d = backbone.arch.d_model
        self.dim = 2 * d if backbone.arch.rcps and self.key.rc_mode == "none" else d
        self.max_tokens = self.key.max_length
        arch = backbone.arch
        # what the token budget's speed depends on (engine.budget): not the weights
        self.tuning_shape = (
            f"caduceus d_model={d} layers={arch.n_layer} rcps={arch.rcps} "
            f"rc={self.key.rc_mode} {str(backbone.device).split(':')[0]}"
        )
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
        """Float32 vectors (len(seqs), dim) of :attr:`key`, in order.

        Raises
        ------
        InvalidSequenceError
            A sequence is empty (its mean over tokens is undefined).
        """
        return self.embed_layers(seqs)[0]

    def embed_layers(self, seqs: Sequence[str]) -> np.ndarray:
        """Float32 (len(keys), len(seqs), dim): every requested layer, one forward pass.

        Equal lengths run together (no attention mask).
        """
        import torch

        out = np.empty((len(self.keys), len(seqs), self.dim), dtype=np.float32)
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
                    out[:, part] = (
                        self._embed_ids(ids.to(self.backbone.device)).cpu().numpy()
                    )
        return out

    def _embed_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """(len(keys), G, dim) pooled vectors of token ids (G, L)."""
        import torch

        arch = self.backbone.arch
        if arch.rcps:  # layers is (-1,): checked at load
            pooled = self.backbone.pooled(ids)
            if self.key.rc_mode == "none":
                return pooled[None]
            d = arch.d_model
            return ((pooled[:, :d] + pooled[:, d:].flip(dims=(-1,))) / 2)[None]
        if self.key.rc_mode == "none":
            return self.backbone.pooled_layers(ids, self.layers)
        n = ids.shape[0]
        both = torch.cat([ids, complement_ids(ids)])
        pooled = self.backbone.pooled_layers(both, self.layers)
        return (pooled[:, :n] + pooled[:, n:]) / 2

    def __repr__(self) -> str:
        return f"CaduceusAdapter({self.key.short()}, dim={self.dim})"


FAMILY = "caduceus"


def recognise(config: dict[str, Any], folder: Path) -> bool:
    """Whether a checkpoint's config is Caduceus (see :func:`is_caduceus_config`)."""
    return is_caduceus_config(config)


def load(source: Source, *, scan: str = "auto") -> CaduceusAdapter:
    """A Caduceus adapter from an official-layout folder (``config.json`` + weights).

    ``options.rc_mode`` None means ``"average"``; ``options.dtype`` ``"bfloat16"``
    runs the in/out projections in bf16 (the scan state, norms and residual stream
    stay float32). ``scan`` is ``"auto"`` (numba kernel on CPU, torch on CUDA),
    ``"numba"`` or ``"torch"``.

    Raises
    ------
    CheckpointError
        The weights are missing, incomplete or do not fit the config.
    AdapterOptionError
        An option does not apply to Caduceus.
    """
    folder, config, options = source.folder, source.config, source.options
    model_id, device = source.model_id, source.device
    rc_mode = options.rc_mode or "average"
    if rc_mode not in RC_MODES:
        msg = f"rc_mode {rc_mode!r} is not one of {RC_MODES} for Caduceus"
        raise AdapterOptionError(msg)
    if scan not in SCANS:
        msg = f"scan {scan!r} is not one of {SCANS}"
        raise AdapterOptionError(msg)
    _check_options(options, model_id)
    on_cuda = device.startswith("cuda")
    if scan == "numba" and on_cuda:
        msg = "scan='numba' runs on CPU tensors only; use scan='torch' or 'auto' with CUDA"
        raise AdapterOptionError(msg)
    if not is_caduceus_config(config):
        msg = f"{folder}/config.json has model_type {config.get('model_type')!r}, not 'caduceus'"
        raise CheckpointError(msg)
    arch = arch_from_config(config, where=str(folder / "config.json"))
    layers = _check_layers(options.layers, arch, model_id)
    key_options: tuple[tuple[str, str], ...] = ()
    if options.random_init is not None:
        # the architecture alone: seeded weights drawn as the family initialises them
        weights = random_weights(arch, config, seed=options.random_init)
        source, option = random_init_twin(source)
        key_options = (option,)
    else:
        weights = weights_from_state_dict(
            arch, read_state_dict(folder), config=config, where=str(folder)
        )
    use_numba = scan == "numba" or (scan == "auto" and not on_cuda)
    backbone = CaduceusBackbone(
        arch,
        weights,
        device=device,
        matmul_dtype=compute_dtype(options),
        kernels="numba" if use_numba else "torch",
    )
    max_length = config.get("max_length") or config.get("max_position_embeddings")
    keys = tuple(
        ModelKey(
            model_id=model_id,
            revision=source.revision,
            adapter="caduceus",
            adapter_version=CADUCEUS_BF16_ADAPTER_VERSION
            if options.dtype == "bfloat16"
            else CADUCEUS_ADAPTER_VERSION,
            layer=layer,
            pooling="mean",
            special_tokens="none",
            rc_mode=rc_mode,
            dtype=options.dtype,
            max_length=int(max_length) if max_length else None,
            options=key_options,
        )
        for layer in layers
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
    return CaduceusAdapter(backbone, keys=keys, alias=source.alias)


def _check_layers(
    layers: tuple[int, ...], arch: CaduceusArch, model_id: str
) -> tuple[int, ...]:
    """Layers a Caduceus adapter can pool: -1 (final norm), 0..n_layer for ph."""
    if layers == (-1,):
        return layers
    if arch.rcps:
        msg = (
            f"{model_id}: Caduceus-ps pools its last layer only (-1); its two strands "
            "swap frames at every block, so an intermediate stream has no fixed layout"
        )
        raise AdapterOptionError(msg)
    bad = [layer for layer in layers if layer > arch.n_layer]
    if bad:
        msg = (
            f"{model_id}: layer {bad[0]} does not exist; use -1 (last, after the final "
            f"norm) or 0..{arch.n_layer} (0 = embeddings, i = after block i)"
        )
        raise AdapterOptionError(msg)
    return layers


def _check_options(options: EmbedOptions, model_id: str) -> None:
    if options.pooling != "mean":
        msg = (
            f"{model_id}: Caduceus is bidirectional and adds no [CLS]: pooling "
            f"{options.pooling!r} does not apply, only mean"
        )
        raise AdapterOptionError(msg)
    names = ("special_tokens", "kmer_split", "truncation", "family_options")
    refuse_options(options, names, before=f"{model_id}: Caduceus adapters take no ")


def load_caduceus_adapter(
    source: str | os.PathLike,
    *,
    revision: str | None = None,
    rc_mode: str = "average",
    dtype: str = "float32",
    device: str = "cpu",
    scan: str = "auto",
) -> CaduceusAdapter:
    """Load a local official-layout Caduceus directory (tests and benchmarks).

    The key is that of :func:`embedcache.models.load_adapter` for the same folder: the
    model id ``local`` and the folder's content digest as revision (a ``revision``
    given must equal it). ``scan`` picks the CPU kernels (see :func:`load`).

    Raises
    ------
    UnknownModelError
        No such directory.
    AdapterOptionError
        A revision other than the content digest, or an unknown option.
    """
    from embedcache.models.registry import LOCAL_MODEL_ID, local_revision, read_config

    folder = Path(os.fspath(source)).expanduser()
    if not folder.is_dir():
        msg = f"Caduceus model {os.fspath(source)!r} is not a local directory; load hub ids with load_adapter"
        raise UnknownModelError(msg)
    content = local_revision(folder)
    if revision is not None and revision != content:
        msg = (
            f"revision {revision!r} was given for the local directory {folder}; a local "
            f"model's revision is its content digest ({content}); drop the revision"
        )
        raise AdapterOptionError(msg)
    request = Source(
        folder=folder,
        config=read_config(folder),
        model_id=LOCAL_MODEL_ID,
        revision=content,
        options=EmbedOptions(rc_mode=rc_mode, dtype=dtype, device=device),
        device=resolve_device(device),
        alias=folder.resolve().name,
    )
    return load(request, scan=scan)
