"""Nucleotide Transformer v2 (InstaDeepAI/nucleotide-transformer-v2-*) without remote code.

The published checkpoints ship ``modeling_esm.py``: an ESM variant with pre-LN blocks,
rotary positions and a gated feed-forward (hidden -> 2 x intermediate, SiLU of the
first half times the second, -> hidden; biases as ``add_bias_fnn`` says). Native
``EsmModel`` has an ungated GELU feed-forward, so these weights would not fit it; they
load into :mod:`.network` instead, strictly: every encoder tensor must be there and
no other may be, except the ones the embedding never uses (the masked-LM head, the
contact head, the unused absolute position table) and the rotary ``inv_freq`` buffers,
which must equal the computed ones.

Recognised from ``config.json``: no ``model_type`` (or ``esm``), an ``add_bias_fnn``
field, and an ``auto_map`` into ``modeling_esm`` when there is one. Its ``auto_map``
names the masked-LM class; the encoder (``esm.*``) is taken from it.

Tokens are those of transformers' ``EsmTokenizer`` over the published ``vocab.txt``
(rebuilt in :mod:`~embedcache.models.shared.esm_tokens`, so no transformers import): ``<cls>`` then
non-overlapping 6-mers from the left; an N, and bases left over before an N or at the
end, are single-base tokens. The vector is the mean over the sequence's tokens
(``<cls>`` excluded) of the final-norm output.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from embedcache.errors import CheckpointError
from embedcache.models.shared.checkpoint import (
    Source,
    auto_map_targets,
    build_filled,
    check_tokenizer_class,
    read_encoder_arch,
    refuse_larger_vocab,
)
from embedcache.models.shared.encoder import EncoderAdapter, EncoderTraits
from embedcache.models.shared.esm_tokens import EsmVocabTokenizer, read_vocab_tokenizer

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    import torch


logger = logging.getLogger(__name__)

FAMILY = "ntv2"
# 2: each sequence padded to the bucket of its own length, not its batch's
# longest (issue 43): fp32 bits changed; now the same in any batch
ADAPTER_VERSION = "2"
# padded tokens per forward pass: in bf16, 4,096 beat the engine's default 1,536 in
# 12 of 13 rounds of benchmarks/embed_bench.py (ntv2-50m shape, 251/500 bp, 2
# threads, load average 2-14; 3% slower in the other), by up to 2.6x under load
TOKEN_BUDGET = 4096
# tensors of the published checkpoints the embedding never uses
HEADS = ("lm_head.", "esm.contact_head.", "esm.pooler.")


def recognise(config: dict[str, Any], folder: Path) -> bool:
    """An NT-v2 config: ``add_bias_fnn`` (a field only the NT-v2 ``EsmConfig`` has),
    no model type other than ``esm``, and an ``auto_map``, if any, into ``modeling_esm``."""
    if "add_bias_fnn" not in config:
        return False
    if config.get("model_type") not in (None, "esm"):
        return False
    targets = auto_map_targets(config)
    return not targets or any(t.startswith("modeling_esm.") for t in targets)


def load_tokenizer(folder: Path, *, where: str) -> EsmVocabTokenizer:
    """The ``EsmTokenizer`` of ``folder`` (``vocab.txt`` + ``tokenizer_config.json``),
    rebuilt by :mod:`~embedcache.models.shared.esm_tokens` without importing transformers.

    Raises
    ------
    CheckpointError
        No ``vocab.txt``, the tokenizer config names another tokenizer class, or the
        tokenizer files ask for what :mod:`~embedcache.models.shared.esm_tokens` does not reproduce.
    """
    check_tokenizer_class(
        folder, "EsmTokenizer", where=where, uses="NT-v2 checkpoints use EsmTokenizer"
    )
    return read_vocab_tokenizer(folder, where=where)


def encoder_state(
    state: Mapping[str, torch.Tensor], *, head_dim: int, where: str
) -> dict[str, torch.Tensor]:
    """The encoder's tensors of a published ``EsmForMaskedLM`` state dict, named as in
    :class:`.network.NTv2Network`; heads and the unused position table dropped.

    Raises
    ------
    CheckpointError
        A stored rotary ``inv_freq`` differs from the computed one (another rotary
        base or dimension: the official code would use the stored one).
    """
    import torch

    from embedcache.models.families.ntv2.network import inverse_frequencies
    from embedcache.models.shared.weights import strip_prefix

    out = strip_prefix(state, "esm.", ignore=HEADS)
    # rotary checkpoints keep ESM's absolute table, which the forward pass never reads
    out.pop("embeddings.position_embeddings.weight", None)
    out.pop("embeddings.position_ids", None)
    expected = inverse_frequencies(head_dim)
    for name in [n for n in out if n.endswith(".rotary_embeddings.inv_freq")]:
        stored = out.pop(name).to(torch.float32)
        if stored.shape != expected.shape or not torch.allclose(
            stored, expected, rtol=1e-6, atol=0
        ):
            msg = (
                f"{where}: {name} is not the rotary frequencies of base 10000 over "
                f"{head_dim} dimensions; embedcache cannot reproduce this model"
            )
            raise CheckpointError(msg)
    return out


def load(source: Source) -> EncoderAdapter:
    """An NT-v2 adapter from a hub-layout folder (config, weights, ``vocab.txt``).

    Raises :class:`CheckpointError` when the config, tokenizer or weights do not
    describe an NT-v2 model, :class:`AdapterOptionError` for an option that does not
    apply to it.
    """
    from embedcache.models.families.ntv2 import network as ntv2_network

    folder, where = source.folder, source.where
    arch = read_encoder_arch(
        source, ntv2_network.arch_from_config, family="ntv2", label="NT-v2"
    )
    tokenizer = load_tokenizer(folder, where=where)
    refuse_larger_vocab(where, "vocab.txt", len(tokenizer), arch.vocab_size)
    network, source, key_options = build_filled(
        lambda: ntv2_network.NTv2Network(arch),
        source,
        init=lambda net, seed: ntv2_network.init_weights(net, seed=seed),
        state=lambda state: encoder_state(
            state, head_dim=arch.head_dim, where=str(folder)
        ),
        family="NT-v2",
    )
    limit, heads = tokenizer.max_tokens, arch.n_heads
    traits = EncoderTraits.bidirectional(
        FAMILY, ADAPTER_VERSION, key_options, limit, heads, TOKEN_BUDGET
    )
    return EncoderAdapter(tokenizer, network, traits, source)


__all__ = [
    "ADAPTER_VERSION",
    "FAMILY",
    "encoder_state",
    "load",
    "load_tokenizer",
    "recognise",
]
