"""HyenaDNA (LongSafari/hyenadna-*-seqlen-hf) in plain PyTorch, without remote code.

Loads the published checkpoints (``config.json`` with ``model_type: hyenadna`` +
``model.safetensors`` or ``pytorch_model.bin``) into :mod:`.network` and runs
them through the common :class:`~embedcache.models.shared.encoder.EncoderAdapter`: no
``trust_remote_code``, any transformers version, no network when the files are local.

Tokens are the official tokenizer's defaults: one per base (A 7, C 8, G 9, T 10,
N 11; anything else [UNK] 6) and a trailing [SEP] (1), which is a special token and
stays out of the mean unless special tokens are included. There is no [CLS] (the hub
tokenizer's ``build_inputs_with_special_tokens`` appends [SEP] only), so pooling
``cls`` is refused; the model is causal, so ``last`` is the last base's state (with
``--include-special-tokens``, the [SEP]'s, which is what the hub's sequence
classifier reads).

The official tokenizer pads on the left and the model takes no attention mask, so a
left-padded batch changes every real position's output; here padding is on the right
and only real positions are pooled, which is exact for a causal model: a sequence's
vector does not depend on its batch.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from embedcache.errors import AdapterOptionError
from embedcache.models.shared.char_tokens import BASE_IDS, UNK_ID, lookup, token_table
from embedcache.models.shared.checkpoint import Source, fill_weights
from embedcache.models.shared.encoder import Encoded, EncoderAdapter, EncoderTraits

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    import numpy as np


logger = logging.getLogger(__name__)

FAMILY = "hyenadna"
# 2: each sequence padded to the bucket of its own length, not its batch's
# longest (issue 43): fp32 bits changed; now the same in any batch
# 3: the CPU kernels vectorised, in/out_proj one matmul (issue 43): fp32 bits moved
ADAPTER_VERSION = "3"
SEP_ID = 1
PAD_ID = 4
# padded tokens per forward pass (the RC strand included): see benchmarks/hyena_bench.py
TOKEN_BUDGET = 8192
# the official tokenizer does not upper-case: lower case is [UNK]
_TOKENS = token_table(lower=False)


def tokenize(seq: str) -> np.ndarray:
    """The official token ids of an upper-case ``seq``, without the trailing [SEP].

    Like the official tokenizer, this does not upper-case: lower case maps to [UNK]
    (embedcache upper-cases every sequence before it gets here).
    """
    return lookup(_TOKENS, seq)


class HyenaTokenizer:
    """The hub tokenizer's default encoding: the bases, then [SEP] (special)."""

    pad_id = PAD_ID

    def encode(self, seq: str) -> Encoded:
        ids = (*tokenize(seq).tolist(), SEP_ID)
        return Encoded(ids, (False,) * len(seq) + (True,))

    def encode_many(self, seqs: Sequence[str]) -> list[Encoded]:
        return [self.encode(seq) for seq in seqs]


def is_hyena_config(config: dict[str, Any]) -> bool:
    """Whether a ``config.json`` dict describes a HyenaDNA model (the hub's port)."""
    if config.get("model_type") == "hyenadna":
        return True
    return any(
        str(name).startswith("HyenaDNA") for name in config.get("architectures") or ()
    )


def recognise(config: dict[str, Any], folder: Path) -> bool:
    """Whether a checkpoint is HyenaDNA (see :func:`is_hyena_config`)."""
    return is_hyena_config(config)


def load(source: Source) -> EncoderAdapter:
    """A HyenaDNA adapter from an official-layout folder (``config.json`` + weights).

    ``options.rc_mode`` None means ``"none"`` (the model as published, one strand);
    ``options.dtype`` ``"bfloat16"`` runs the four projections of each block (in,
    out, and the MLP's two) in bf16; the embedding, norms, short convolution, the
    implicit filter, the FFT convolution and the residual stream stay float32.

    Raises
    ------
    CheckpointError
        The config is not a supported HyenaDNA shape, or the weights are missing,
        incomplete or do not fit it.
    AdapterOptionError
        An option does not apply to HyenaDNA.
    """
    import torch

    # the network modules import torch: only when a HyenaDNA model loads
    from embedcache.models.families.hyena.checkpoint import (
        arch_from_config,
        prepare_state,
    )
    from embedcache.models.families.hyena.network import HyenaBackbone, init_official

    folder, config, options = source.folder, source.config, source.options
    name = source.where
    if options.family_options:
        flags = ", ".join(f"{k}={v}" for k, v in options.family_options)
        msg = f"{name}: HyenaDNA takes no --family-option (got {flags})"
        raise AdapterOptionError(msg)
    arch = arch_from_config(config, where=str(folder / "config.json"))
    with torch.device("cpu"):
        backbone = HyenaBackbone(arch)
    source, key_options = fill_weights(
        backbone,
        source,
        init=lambda net, seed: init_official(net, seed=seed),
        state=lambda state: prepare_state(state, arch, where=str(folder)),
        family=FAMILY,
    )
    device = source.device
    backbone = backbone.to(device).eval()
    if options.dtype == "bfloat16":
        backbone.set_compute_dtype(torch.bfloat16)
    # numba kernels between the matmuls on CPU; torch ops elsewhere
    backbone.set_kernels("numba" if torch.device(device).type == "cpu" else "torch")
    traits = EncoderTraits(
        family=FAMILY,
        adapter_version=ADAPTER_VERSION,
        causal=True,
        has_cls=False,
        max_tokens=arch.max_seq_len,
        options=tuple(key_options),
        token_budget=TOKEN_BUDGET,
    )
    logger.info(
        "loaded HyenaDNA (d_model %d, %d layers, context %d) from %s on %s",
        arch.d_model,
        arch.n_layer,
        arch.max_seq_len,
        folder,
        device,
    )
    return EncoderAdapter(HyenaTokenizer(), backbone, traits, source)


__all__ = [
    "ADAPTER_VERSION",
    "BASE_IDS",
    "FAMILY",
    "UNK_ID",
    "HyenaTokenizer",
    "is_hyena_config",
    "load",
    "recognise",
    "tokenize",
]
