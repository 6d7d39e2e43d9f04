"""GENA-LM BERT models (AIRI-Institute/gena-lm-bert-*-t2t) without remote code.

Their ``config.json`` says ``model_type: bert``, but the network is GENA-LM's own
pre-LN BERT (``pre_attention_ln`` / ``post_attention_ln`` in every block, an optional
final ``last_layer_ln``): loaded as native ``BertModel`` it would get random
post-attention LayerNorms and ignore the pre-LN ones. So it is recognised here first,
from the GENA-only config fields (``pre_layer_norm``, ``last_layer_norm``) or, when a
config lacks them, from the weight names (``.pre_attention_ln.``), and loaded into
:mod:`._gena_model` strictly (the masked-LM head ``cls.*`` and a pooler left out).
The native path refuses these checkpoints too: their tensors do not fit ``BertModel``.

Tokens come from the published BPE (``tokenizer.json``, read with ``tokenizers``):
[CLS], the sequence's tokens, [SEP]; a run of 10 or more N becomes one ``-`` token.
The vector is the mean over the sequence's tokens ([CLS] and [SEP] excluded) of the
final output.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from embedcache.errors import AdapterOptionError, CheckpointError
from embedcache.models.encoder import (
    Encoded,
    EncoderAdapter,
    EncoderTraits,
    config_digest,
)
from embedcache.models.options import non_default, random_init_revision

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    import torch

    from embedcache.models.options import EmbedOptions

logger = logging.getLogger(__name__)

FAMILY = "gena"
ADAPTER_VERSION = "1"
# tensors of the published checkpoints the embedding never uses: the masked-LM (and
# next-sentence) heads and the [CLS] pooler
HEADS = ("cls.", "bert.pooler.")
# config fields only GENA-LM's BertConfig carries
_GENA_FIELDS = ("pre_layer_norm", "last_layer_norm")
# GENA-LM's pre-LN blocks have these norms instead of BERT's post-LN ones
_GENA_WEIGHT = ".pre_attention_ln."
_POST_LN_WEIGHT = ".attention.output.LayerNorm."


def _header_weight_names(folder: Path) -> frozenset[str]:
    """Tensor names readable without loading tensors (safetensors header, shard
    index); empty for a single pickle, which would have to be loaded whole."""
    from embedcache.models.weights import weight_names

    has_header = (folder / "model.safetensors").is_file() or any(
        (folder / n).is_file()
        for n in ("model.safetensors.index.json", "pytorch_model.bin.index.json")
    )
    if not has_header:
        return frozenset()
    try:
        return weight_names(folder)
    except CheckpointError:
        return frozenset()


def recognise(config: dict[str, Any], folder: Path) -> bool:
    """A ``model_type: bert`` config with GENA-LM's fields, or BERT weights in
    GENA-LM's pre-LN layout (pre-attention LayerNorms, no post-LN ones)."""
    if config.get("model_type") != "bert":
        return False
    if any(field in config for field in _GENA_FIELDS):
        return True
    # the pre-LN layout, not a native BERT with a stray tensor (which the native
    # path refuses with its own message)
    names = _header_weight_names(folder)
    return any(_GENA_WEIGHT in n for n in names) and not any(
        _POST_LN_WEIGHT in n for n in names
    )


class GenaTokenizer:
    """A ``tokenizers`` BPE (the published ``tokenizer.json``) as a
    :class:`~embedcache.models.encoder.SequenceTokenizer`; special flags from the
    encoding's own special-tokens mask ([CLS] and [SEP])."""

    def __init__(self, tokenizer: Any, *, pad_id: int) -> None:  # noqa: ANN401
        self.tokenizer = tokenizer
        self.pad_id = pad_id

    def encode(self, seq: str) -> Encoded:
        return self.encode_many([seq])[0]

    def encode_many(self, seqs: Sequence[str]) -> list[Encoded]:
        if not seqs:
            return []
        return [
            Encoded(tuple(e.ids), tuple(bool(s) for s in e.special_tokens_mask))
            for e in self.tokenizer.encode_batch(list(seqs), add_special_tokens=True)
        ]


def load_tokenizer(folder: Path, *, where: str) -> Any:  # noqa: ANN401
    """The ``tokenizers.Tokenizer`` of ``folder/tokenizer.json``, padding and
    truncation off.

    Raises
    ------
    CheckpointError
        No ``tokenizer.json``, or it cannot be read.
    """
    from tokenizers import Tokenizer

    path = folder / "tokenizer.json"
    if not path.is_file():
        msg = f"{where}: no tokenizer.json; GENA-LM tokenises with its published BPE"
        raise CheckpointError(msg)
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises its own Exception type
        msg = f"cannot read the tokenizer in {path}: {err}"
        raise CheckpointError(msg) from err
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def encoder_state(
    state: Mapping[str, torch.Tensor], *, where: str
) -> dict[str, torch.Tensor]:
    """The encoder's tensors of a published ``BertForMaskedLM`` state dict, named as in
    :class:`._gena_model.GenaNetwork`; heads and buffers dropped.

    Raises
    ------
    CheckpointError
        A stored ``position_ids`` buffer is not 0, 1, 2, ... (the official code would
        read positions from it).
    """
    import torch

    from embedcache.models.weights import strip_prefix

    out = strip_prefix(state, "bert.", ignore=HEADS)
    out.pop("embeddings.token_type_ids", None)  # all zeros when stored: token type 0
    positions = out.pop("embeddings.position_ids", None)
    if positions is not None:
        flat = positions.reshape(-1).to(torch.long)
        if not torch.equal(flat, torch.arange(flat.numel())):
            msg = f"{where}: bert.embeddings.position_ids is not 0, 1, 2, ...; cannot reproduce it"
            raise CheckpointError(msg)
    return out


def _check_options(options: EmbedOptions, where: str) -> None:
    flags = non_default(options, ("kmer_split", "family_options"))
    if flags:
        msg = f"{where} (gena): {', '.join(flags)} do(es) not apply to GENA-LM"
        raise AdapterOptionError(msg)


def _tokenizer_class(folder: Path) -> str | None:
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("tokenizer_class")
    except (OSError, json.JSONDecodeError, AttributeError) as err:
        msg = f"cannot read {path}: {err}"
        raise CheckpointError(msg) from err


def load(
    folder: Path,
    config: dict[str, Any],
    *,
    model_id: str,
    revision: str,
    options: EmbedOptions,
    device: str,
    alias: str | None = None,
) -> EncoderAdapter:
    """A GENA-LM adapter from a hub-layout folder (config, weights, ``tokenizer.json``).

    Raises
    ------
    CheckpointError
        The config, tokenizer or weights do not describe a GENA-LM BERT model.
    AdapterOptionError
        An option does not apply to GENA-LM.
    """
    import torch

    from embedcache.models._gena_model import (
        GenaNetwork,
        arch_from_config,
        init_weights,
    )
    from embedcache.models.weights import load_strict, read_state_dict

    where = str(alias or model_id)
    _check_options(options, where)
    arch = arch_from_config(config, where=f"{folder}/config.json")
    declared = _tokenizer_class(folder)
    if declared not in (None, "PreTrainedTokenizerFast"):
        msg = (
            f"{where}: tokenizer_config.json names {declared!r}; GENA-LM checkpoints "
            "use a PreTrainedTokenizerFast over tokenizer.json"
        )
        raise CheckpointError(msg)
    tokenizer = load_tokenizer(folder, where=where)
    if tokenizer.get_vocab_size(with_added_tokens=True) > arch.vocab_size:
        msg = (
            f"{where}: tokenizer.json has {tokenizer.get_vocab_size()} tokens but the "
            f"model's vocab_size is {arch.vocab_size}"
        )
        raise CheckpointError(msg)
    # built without its random init (weights or the family's own init replace it)
    with torch.device("meta"):
        network = GenaNetwork(arch)
    network = network.to_empty(device="cpu")
    key_options: list[tuple[str, str]] = []
    if options.random_init is not None:
        init_weights(network, seed=options.random_init)
        revision = random_init_revision(options.random_init)
        key_options.append(("config", config_digest(config)))
    else:
        state = encoder_state(read_state_dict(folder), where=str(folder))
        load_strict(network, state, where=str(folder), family="GENA-LM")
    dtype = torch.bfloat16 if options.dtype == "bfloat16" else torch.float32
    network = network.to(device=device, dtype=dtype).eval()
    traits = EncoderTraits(
        family=FAMILY,
        adapter_version=ADAPTER_VERSION,
        causal=False,
        has_cls=True,
        max_tokens=arch.max_positions,
        options=tuple(key_options),
        attention_heads=arch.n_heads,
    )
    return EncoderAdapter(
        tokenizer=GenaTokenizer(tokenizer, pad_id=arch.pad_token_id),
        network=network,
        traits=traits,
        model_id=model_id,
        revision=revision,
        options=options,
        device=device,
        alias=alias,
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
