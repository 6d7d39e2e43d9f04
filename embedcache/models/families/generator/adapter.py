"""GENERator (GenerTeam/GENERator-eukaryote-{1.2b,3b}-base): native Llama, our own 6-mer tokenizer.

The published checkpoints are plain Llama weights (``model_type: llama``) under a
repository-code class name (``GENERatorForCausalLM``) and a repository-code tokenizer
(``tokenizer.DNAKmerTokenizer``). The network loads into transformers' own
``LlamaModel`` (the ``lm_head`` is dropped), strictly: a missing, unexpected or
misshaped tensor is refused. The tokenizer is reimplemented here; no repository code
runs.

The official tokenizer, as its vocabulary, configuration and recorded outputs show:

- ids 0-31 are special tokens (``<oov>`` 0, ``<s>`` 1, ``</s>`` 2, ``<pad>`` 3,
  ``<mask>`` 4, annotation tokens after), then the 4,096 6-mers in
  ``itertools.product("ATCG", repeat=6)`` order: AAAAAA is 32, TTTTTT 1397, GGGGGG 4127;
- the (upper-case) sequence is cut into non-overlapping 6-mers from the left; a chunk
  holding anything but A/C/G/T (an N) is ``<oov>``, and so is a tail shorter than 6:
  a 251 bp sequence ends in one ``<oov>`` standing for its last 5 bases;
- ``<s>`` (BOS) is prepended; no EOS.

Remainder handling is a family option: ``remainder=oov`` (default, the official
tokenizer's behaviour) or ``remainder=trim`` (cut the sequence to a multiple of 6
first, as the GENEB benchmark does). The trailing and N ``<oov>`` tokens are tokens
of the sequence and enter the mean; only BOS is special.
"""

from __future__ import annotations

import json
import logging
import re
import warnings
from itertools import product
from typing import TYPE_CHECKING, Any

from embedcache.errors import AdapterOptionError, CheckpointError
from embedcache.models.shared.checkpoint import (
    TOKENIZER_CONFIG,
    Source,
    compute_dtype,
    random_init_twin,
    read_json_object,
)
from embedcache.models.shared.encoder import Encoded, EncoderAdapter, EncoderTraits
from embedcache.models.shared.weights import load_strict, read_state_dict, strip_prefix

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    import torch

    from embedcache.models.options import EmbedOptions

logger = logging.getLogger(__name__)

FAMILY = "generator"
# 2: each sequence padded to the bucket of its own length, not its batch's
# longest (issue 43): fp32 bits changed; now the same in any batch
ADAPTER_VERSION = "2"

K = 6
ALPHABET = "ATCG"  # the vocabulary's own order, not A/C/G/T
N_SPECIAL = 32
OOV_ID, BOS_ID, EOS_ID, PAD_ID, MASK_ID = 0, 1, 2, 3, 4
# the five special tokens the tokenizer configuration names; ids 5-31 are annotation
# tokens (<bog>, <cds>, ...) whose names changed between hub revisions
NAMED_SPECIALS = ("<oov>", "<s>", "</s>", "<pad>", "<mask>")
VOCAB_SIZE = N_SPECIAL + 4**K
REMAINDERS = ("oov", "trim")
FAMILY_OPTIONS = {"remainder": REMAINDERS}
PADDING_SIDE = "right"
_REPO_CLASS = "GENERatorForCausalLM"
_REPO_TOKENIZER = "DNAKmerTokenizer"
# the official rule: runs of up to 6 capital letters, any other character alone
_CHUNK = re.compile(rf"[A-Z]{{{K}}}|[A-Z]+|[\s\S]")
_DROPPED_HEADS = ("lm_head.",)


def kmer_vocabulary() -> list[str]:
    """The 4,096 6-mers in vocabulary order (id = 32 + position)."""
    return ["".join(kmer) for kmer in product(ALPHABET, repeat=K)]


class KmerTokenizer:
    """GENERator's 6-mer tokenizer as a :class:`SequenceTokenizer`.

    Parameters
    ----------
    remainder
        ``"oov"``: a tail shorter than 6 becomes one ``<oov>`` token (the official
        tokenizer); ``"trim"``: the tail is cut off before tokenising.
    """

    pad_id = PAD_ID

    def __init__(self, *, remainder: str = "oov") -> None:
        if remainder not in REMAINDERS:
            msg = f"remainder {remainder!r} is not one of {', '.join(REMAINDERS)}"
            raise AdapterOptionError(msg)
        self.remainder = remainder
        self._ids = {kmer: N_SPECIAL + i for i, kmer in enumerate(kmer_vocabulary())}

    def token_ids(self, seq: str) -> list[int]:
        """BOS followed by one id per 6-base chunk of ``seq`` (upper-cased first)."""
        seq = seq.upper()
        if self.remainder == "trim":
            seq = seq[: len(seq) - len(seq) % K]
        ids = self._ids
        return [BOS_ID] + [ids.get(m.group(), OOV_ID) for m in _CHUNK.finditer(seq)]

    def encode(self, seq: str) -> Encoded:
        ids = self.token_ids(seq)
        return Encoded(tuple(ids), (True,) + (False,) * (len(ids) - 1))

    def encode_many(self, seqs: Sequence[str]) -> list[Encoded]:
        return [self.encode(s) for s in seqs]


def recognise(config: dict[str, Any], folder: Path) -> bool:
    """A Llama config whose repository code is GENERator's (model or tokenizer)."""
    if config.get("model_type") != "llama":
        return False
    architectures = config.get("architectures") or []
    auto_map = json.dumps(config.get("auto_map") or {})
    if _REPO_CLASS in architectures or "modeling_generator." in auto_map:
        return True
    try:
        tokenizer_config = read_json_object(folder / TOKENIZER_CONFIG) or {}
    except CheckpointError:  # not ours to judge: the family that claims it will say
        return False
    tok_map = json.dumps(tokenizer_config.get("auto_map") or {})
    return (
        tokenizer_config.get("tokenizer_class") == _REPO_TOKENIZER
        or f"tokenizer.{_REPO_TOKENIZER}" in tok_map
    )


def check_vocabulary(folder: Path, config: dict[str, Any]) -> None:
    """Refuse a checkpoint whose vocabulary is not the one this tokenizer writes.

    Checks ``config.json``'s ``vocab_size``, ``tokenizer_config.json``'s ``k`` and,
    where present, ``vocab.txt`` (either published layout: ``piece`` or ``piece id``
    per line).

    Raises
    ------
    CheckpointError
        Naming the file and the first entry that differs.
    """
    where = f"{folder} (GENERator)"
    tokenizer_config = read_json_object(folder / TOKENIZER_CONFIG) or {}
    k = tokenizer_config.get("k", K)
    if k != K:
        msg = (
            f"{where}: tokenizer_config.json says k={k}; embedcache's GENERator "
            f"tokenizer is the published {K}-mer one"
        )
        raise CheckpointError(msg)
    if config.get("vocab_size") != VOCAB_SIZE:
        msg = (
            f"{where}: config.json has vocab_size {config.get('vocab_size')}, not "
            f"{VOCAB_SIZE} (32 special tokens + 4,096 6-mers): a different vocabulary "
            "than the published GENERator tokenizer's"
        )
        raise CheckpointError(msg)
    vocab = folder / "vocab.txt"
    if not vocab.is_file():
        return
    lines = vocab.read_text(encoding="utf-8").splitlines()
    expected = {i: name for i, name in enumerate(NAMED_SPECIALS)}
    expected.update({N_SPECIAL + i: m for i, m in enumerate(kmer_vocabulary())})
    if len(lines) != VOCAB_SIZE:
        msg = f"{vocab} has {len(lines)} entries, not {VOCAB_SIZE}"
        raise CheckpointError(msg)
    for i, line in enumerate(lines):
        piece, _, rest = line.partition(" ")
        if (rest and rest != str(i)) or (i in expected and piece != expected[i]):
            msg = (
                f"{vocab} line {i + 1} reads {line!r}; the GENERator vocabulary has "
                f"{expected.get(i, 'a special token')!r} with id {i} there"
            )
            raise CheckpointError(msg)


def llama_config(config: dict[str, Any], *, where: str = "GENERator") -> Any:  # noqa: ANN401
    """transformers' ``LlamaConfig`` from the published dict (repository fields ignored)."""
    from transformers import LlamaConfig

    fields = {k: v for k, v in config.items() if k not in ("auto_map", "architectures")}
    try:
        return LlamaConfig.from_dict(fields)
    except Exception as err:  # transformers' config validators raise their own types
        msg = (
            f"{where}: config.json does not describe a Llama model transformers can "
            f"build: {err}"
        )
        raise CheckpointError(msg) from err


def build_llama(
    config: dict[str, Any],
    *,
    folder: Path | None,
    where: str,
    seed: int | None = None,
    dtype: torch.dtype | None = None,
) -> torch.nn.Module:
    """``LlamaModel`` with the checkpoint's weights (strict) or seeded random ones.

    With ``folder``, the module is built on the meta device and the checkpoint's
    tensors are assigned to it, so a 3B model never exists twice in memory.
    """
    import torch
    from transformers import LlamaModel

    cfg = llama_config(config, where=where)
    if folder is None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed or 0)
            model = LlamaModel(cfg)  # transformers' Llama init: N(0, initializer_range)
        model.requires_grad_(False)
        return model.to(dtype) if dtype is not None else model
    with torch.device("meta"):
        model = LlamaModel(cfg)
    state = strip_prefix(read_state_dict(folder), "model.", ignore=_DROPPED_HEADS)
    with warnings.catch_warnings():
        # strict names and shapes; the copy into meta tensors is a no-op, torch says so
        warnings.filterwarnings("ignore", message=".*meta parameter.*")
        load_strict(model, state, where=where, family="GENERator (LlamaModel)")
    if dtype is not None:  # one tensor at a time: the peak stays one model's size
        for name in list(state):
            state[name] = state[name].to(dtype)
    model.load_state_dict(state, strict=True, assign=True)
    model.requires_grad_(False)
    # the rotary frequencies are computed, never stored: rebuild them off the meta device
    model.rotary_emb = type(model.rotary_emb)(config=cfg)
    meta = [
        n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta
    ]
    if meta:
        msg = f"{where}: tensors left unloaded after assignment: {', '.join(meta[:5])}"
        raise CheckpointError(msg)
    return model


def _check_options(options: EmbedOptions, *, where: str) -> str:
    """Validate GENERator's options; return the remainder policy."""
    if options.pooling == "cls":
        msg = (
            f"{where}: --pooling cls does not apply to GENERator: its first token is BOS "
            "<s>, not a classification token, and in a causal model BOS sees only itself, "
            "so its hidden state is the same for every sequence. Use --pooling mean or last."
        )
        raise AdapterOptionError(msg)
    given = options.family_option_map
    unknown = sorted(set(given) - set(FAMILY_OPTIONS))
    if unknown:
        msg = (
            f"{where}: --family-option {unknown[0]} is not a GENERator option; it knows "
            f"remainder={'|'.join(REMAINDERS)}"
        )
        raise AdapterOptionError(msg)
    remainder = given.get("remainder", "oov")
    if remainder not in REMAINDERS:
        msg = (
            f"{where}: --family-option remainder={remainder} is not one of "
            f"{', '.join(REMAINDERS)} (oov: a trailing <oov> token, as the official "
            "tokenizer; trim: cut to a multiple of 6, as GENEB)"
        )
        raise AdapterOptionError(msg)
    return remainder


def load(source: Source) -> EncoderAdapter:
    """A GENERator checkpoint as an :class:`EncoderAdapter` (no repository code runs).

    Raises
    ------
    AdapterOptionError
        ``--pooling cls`` or an unknown or invalid ``--family-option``.
    CheckpointError
        The vocabulary or the weights do not fit the published GENERator layout.
    """
    folder, config, options = source.folder, source.config, source.options
    where = source.alias or source.model_id
    remainder = _check_options(options, where=where)
    check_vocabulary(folder, config)
    dtype = compute_dtype(options)
    key_options = [
        ("padding", PADDING_SIDE),
        ("remainder", remainder),
        ("tokenizer", f"kmer{K}-bos"),
    ]
    if options.random_init is not None:
        model = build_llama(
            config, folder=None, where=where, seed=options.random_init, dtype=dtype
        )
        source, option = random_init_twin(source)
        key_options.append(option)
    else:
        model = build_llama(config, folder=folder, where=f"{folder}", dtype=dtype)
    from embedcache.models.families.hf.network import HFNetwork

    network = (
        HFNetwork(model, model.config, causal=True).to(device=source.device).eval()
    )
    limit = config.get("max_position_embeddings")
    traits = EncoderTraits(
        family=FAMILY,
        adapter_version=ADAPTER_VERSION,
        causal=True,
        has_cls=False,
        max_tokens=int(limit) if isinstance(limit, int) else None,
        options=tuple(key_options),
        attention_heads=int(config.get("num_attention_heads") or 0),
    )
    return EncoderAdapter(KmerTokenizer(remainder=remainder), network, traits, source)


__all__ = [
    "ADAPTER_VERSION",
    "ALPHABET",
    "BOS_ID",
    "FAMILY",
    "OOV_ID",
    "PAD_ID",
    "REMAINDERS",
    "VOCAB_SIZE",
    "KmerTokenizer",
    "build_llama",
    "check_vocabulary",
    "kmer_vocabulary",
    "llama_config",
    "load",
    "recognise",
]
