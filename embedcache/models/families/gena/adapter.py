"""GENA-LM BERT models (AIRI-Institute/gena-lm-bert-*-t2t) without remote code.

Their ``config.json`` says ``model_type: bert``, but the network is GENA-LM's own
pre-LN BERT (``pre_attention_ln`` / ``post_attention_ln`` in every block, an optional
final ``last_layer_ln``): loaded as native ``BertModel`` it would get random
post-attention LayerNorms and ignore the pre-LN ones. So it is recognised here first,
from the GENA-only config fields (``pre_layer_norm``, ``last_layer_norm``) or, when a
config lacks them, from the weight names (``.pre_attention_ln.``), and loaded into
:mod:`.network` strictly (the masked-LM head ``cls.*`` and a pooler left out).
The native path refuses these checkpoints too: their tensors do not fit ``BertModel``.

Tokens come from the published BPE (``tokenizer.json``, read with ``tokenizers``):
[CLS], the sequence's tokens, [SEP]; a run of 10 or more N becomes one ``-`` token.
The vector is the mean over the sequence's tokens ([CLS] and [SEP] excluded) of the
final output.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from embedcache.errors import CheckpointError
from embedcache.models.shared import checkpoint
from embedcache.models.shared.checkpoint import (
    Source,
    build_filled,
    check_tokenizer_class,
    read_encoder_arch,
)
from embedcache.models.shared.encoder import EncoderAdapter, EncoderTraits
from embedcache.models.shared.tokenizer_json import JsonTokenizer, read_tokenizer_json

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    import torch


logger = logging.getLogger(__name__)

FAMILY = "gena"
# 2: each sequence padded to the bucket of its own length, not its batch's
# longest (issue 43): fp32 bits changed; now the same in any batch
ADAPTER_VERSION = "2"
# tensors of the published checkpoints the embedding never uses: the masked-LM (and
# next-sentence) heads and the [CLS] pooler
HEADS = ("cls.", "bert.pooler.")
# config fields only GENA-LM's BertConfig carries
_GENA_FIELDS = ("pre_layer_norm", "last_layer_norm")
# GENA-LM's pre-LN blocks have these norms instead of BERT's post-LN ones
_GENA_WEIGHT = ".pre_attention_ln."
_POST_LN_WEIGHT = ".attention.output.LayerNorm."


def recognise(config: dict[str, Any], folder: Path) -> bool:
    """A ``model_type: bert`` config with GENA-LM's fields, or BERT weights in
    GENA-LM's pre-LN layout (pre-attention LayerNorms, no post-LN ones)."""
    if config.get("model_type") != "bert":
        return False
    if any(field in config for field in _GENA_FIELDS):
        return True
    # the pre-LN layout, not a native BERT with a stray tensor (which the native
    # path refuses with its own message)
    from embedcache.models.shared.weights import header_weight_names

    names = header_weight_names(folder)
    return any(_GENA_WEIGHT in n for n in names) and not any(
        _POST_LN_WEIGHT in n for n in names
    )


# [CLS] and [SEP] flagged by the encoding's own special-tokens mask
GenaTokenizer = JsonTokenizer


def load_tokenizer(folder: Path, *, where: str) -> Any:  # noqa: ANN401
    """The ``tokenizers.Tokenizer`` of ``folder/tokenizer.json``, padding and
    truncation off.

    Raises
    ------
    CheckpointError
        No ``tokenizer.json``, or it cannot be read.
    """
    return read_tokenizer_json(
        folder,
        missing=f"{where}: no tokenizer.json; GENA-LM tokenises with its published BPE",
        unreadable=f"cannot read the tokenizer in {folder / 'tokenizer.json'}",
    )


def encoder_state(
    state: Mapping[str, torch.Tensor], *, where: str
) -> dict[str, torch.Tensor]:
    """The encoder's tensors of a published ``BertForMaskedLM`` state dict, named as in
    :class:`.network.GenaNetwork`; heads and buffers dropped.

    Raises
    ------
    CheckpointError
        A stored ``position_ids`` buffer is not 0, 1, 2, ... (the official code would
        read positions from it).
    """
    import torch

    from embedcache.models.shared.weights import strip_prefix

    out = strip_prefix(state, "bert.", ignore=HEADS)
    out.pop("embeddings.token_type_ids", None)  # all zeros when stored: token type 0
    positions = out.pop("embeddings.position_ids", None)
    if positions is not None:
        flat = positions.reshape(-1).to(torch.long)
        if not torch.equal(flat, torch.arange(flat.numel())):
            msg = f"{where}: bert.embeddings.position_ids is not 0, 1, 2, ...; cannot reproduce it"
            raise CheckpointError(msg)
    return out


def load(source: Source) -> EncoderAdapter:
    """A GENA-LM adapter from a hub-layout folder (config, weights, ``tokenizer.json``).

    Raises :class:`CheckpointError` when the config, tokenizer or weights do not
    describe a GENA-LM BERT model, :class:`AdapterOptionError` for an option that
    does not apply to it.
    """
    from embedcache.models.families.gena import network as gena_network

    folder, where = source.folder, source.where
    arch = read_encoder_arch(
        source, gena_network.arch_from_config, family="gena", label="GENA-LM"
    )
    check_tokenizer_class(
        folder,
        "PreTrainedTokenizerFast",
        where=where,
        uses="GENA-LM checkpoints use a PreTrainedTokenizerFast over tokenizer.json",
    )
    tokenizer = load_tokenizer(folder, where=where)
    n_tokens = tokenizer.get_vocab_size(with_added_tokens=True)
    checkpoint.refuse_larger_vocab(where, "tokenizer.json", n_tokens, arch.vocab_size)
    network, source, key_options = build_filled(
        lambda: gena_network.GenaNetwork(arch),
        source,
        init=lambda net, seed: gena_network.init_weights(net, seed=seed),
        state=lambda state: encoder_state(state, where=str(folder)),
        family="GENA-LM",
    )
    traits = EncoderTraits.bidirectional(
        FAMILY, ADAPTER_VERSION, key_options, arch.max_positions, arch.n_heads
    )
    return EncoderAdapter(
        GenaTokenizer(tokenizer, pad_id=arch.pad_token_id), network, traits, source
    )


__all__ = [
    "ADAPTER_VERSION",
    "FAMILY",
    "GenaTokenizer",
    "encoder_state",
    "load",
    "load_tokenizer",
    "recognise",
]
