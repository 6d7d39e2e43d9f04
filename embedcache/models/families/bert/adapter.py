"""A plain BERT checkpoint loaded without transformers: the ``hf`` family's fast path.

:func:`load_native_bert` takes a ``model_type: bert`` checkpoint whose config asks for
nothing else (:func:`.network.native_config`) and whose tokenizer is a plain
``tokenizer.json`` (:func:`native_tokenizer`): the network from :mod:`.network`, the
tokens from ``tokenizers``, the same vectors and key as transformers' ``BertModel``
(tests/models/test_hf_bert.py). Anything else returns None and ``hf`` loads it
through transformers. The family, adapter version and token limits are ``hf``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from embedcache.errors import CheckpointError
from embedcache.models.families.hf.family import (
    ADAPTER_VERSION,
    FAMILY,
    kmer_split,
    max_tokens,
    token_budget,
)
from embedcache.models.shared.checkpoint import (
    TOKENIZER_CONFIG,
    Source,
    compute_dtype,
    read_json_object,
)
from embedcache.models.shared.encoder import EncoderAdapter, EncoderTraits
from embedcache.models.shared.tokenizer_json import JsonTokenizer

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from embedcache.models.shared.encoder import Encoded

# tokenizer classes that are a tokenizer.json as it stands (transformers 5 and 4
# names); with none named AutoTokenizer picks the model type's class (BertTokenizer)
_PLAIN_FAST = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})


class NativeTokenizer(JsonTokenizer):
    """A ``tokenizer.json`` read by ``tokenizers`` (what transformers' fast tokenizer
    wraps), its input optionally k-mer split as :class:`HFTokenizer` does."""

    def __init__(self, tokenizer: Any, *, pad_id: int, kmer: int | None) -> None:  # noqa: ANN401
        super().__init__(tokenizer, pad_id=pad_id)
        self.kmer = kmer

    def encode_many(self, seqs: Sequence[str]) -> list[Encoded]:
        if self.kmer:
            seqs = [kmer_split(s, self.kmer) for s in seqs]
        return super().encode_many(seqs)


def native_tokenizer(
    folder: Path, *, kmer: int | None
) -> tuple[NativeTokenizer, dict[str, str | None], int | None] | None:
    """The tokenizer ``AutoTokenizer`` would build from ``folder``, without
    transformers, with its special tokens and ``model_max_length``; None unless it is
    a plain ``tokenizer.json`` (``tokenizer_class`` ``TokenizersBackend`` or
    ``PreTrainedTokenizerFast``) whose config adds no token the file lacks.
    """
    from embedcache.models.shared.esm_tokens import read_specials
    from embedcache.models.shared.tokenizer_json import (
        TOKENIZER_FILE,
        read_tokenizer_json,
    )

    where = str(folder)
    try:
        config = read_json_object(folder / TOKENIZER_CONFIG) or {}
        if (
            config.get("tokenizer_class") not in _PLAIN_FAST
            or not (folder / TOKENIZER_FILE).is_file()
        ):
            return None
        named, extra, limit = read_specials(folder, where=where, defaults={})
        tokenizer = read_tokenizer_json(folder, missing=where, unreadable=where)
    except CheckpointError:
        return None  # transformers reads it, or says what is wrong
    declared = [(t, None) for t in (*named.values(), *extra) if t is not None]
    try:
        added = config.get("added_tokens_decoder") or {}
        declared += [(entry["content"], int(i)) for i, entry in added.items()]
    except (AttributeError, KeyError, TypeError, ValueError):
        return None  # not the layout transformers writes: let it judge
    for token, token_id in declared:
        found = tokenizer.token_to_id(token)
        if found is None or (token_id is not None and found != token_id):
            return None
    pad = named["pad_token"]
    pad_id = tokenizer.token_to_id(pad) if pad is not None else 0
    native = NativeTokenizer(tokenizer, pad_id=pad_id, kmer=kmer)
    return native, named, limit if isinstance(limit, int) else None


def load_native_bert(source: Source) -> EncoderAdapter | None:
    """A plain BERT checkpoint with a plain ``tokenizer.json``, loaded without
    transformers (:mod:`.network`); None for anything else."""
    from embedcache.models.families.bert.network import native_config

    if not native_config(source.config):
        return None
    found = native_tokenizer(source.folder, kmer=source.options.kmer_split)
    if found is None:
        return None
    tokenizer, named, limit = found
    from types import SimpleNamespace

    from embedcache.models.families.bert import network as bert_network
    from embedcache.models.shared.checkpoint import empty_module
    from embedcache.models.shared.weights import load_strict, read_state_dict

    folder, options = source.folder, source.options
    arch = bert_network.arch_from_config(source.config, where=str(folder))
    network = empty_module(lambda: bert_network.BertNetwork(arch))
    state = bert_network.encoder_state(read_state_dict(folder))
    load_strict(network, state, where=str(folder), family="BERT")
    network = network.to(device=source.device, dtype=compute_dtype(options)).eval()
    key_options = [("model_type", "bert")]
    if options.kmer_split is not None:
        key_options.append(("kmer_split", str(options.kmer_split)))
    # BertConfig's default table size where config.json names none
    config = SimpleNamespace(
        **{**source.config, "max_position_embeddings": arch.max_positions}
    )
    traits = EncoderTraits(
        family=FAMILY,
        adapter_version=ADAPTER_VERSION,
        causal=False,
        has_cls=named["cls_token"] is not None or named["bos_token"] is not None,
        max_tokens=max_tokens(config, SimpleNamespace(model_max_length=limit)),
        options=tuple(key_options),
        token_budget=token_budget(arch.hidden_size),
        attention_heads=arch.n_heads,
    )
    return EncoderAdapter(tokenizer, network, traits, source)
