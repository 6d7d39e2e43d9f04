"""Native Hugging Face encoders (BERT, ESM / Nucleotide Transformer v1, DNABERT, GROVER...).

The fallback family: a checkpoint whose config names a class transformers ships,
loaded through ``AutoTokenizer`` / ``AutoModel``. Loading is strict: a tensor of the
encoder missing from the checkpoint, or one the checkpoint holds under the encoder's
modules that the class has no place for, is refused (a checkpoint that only *looks*
native, such as GENA-LM's ``model_type: bert``, never loads silently into the wrong
class). Task heads (``cls.*``, ``lm_head.*`` ...) are left out on purpose.

A plain BERT (``model_type: bert``, exact GELU, absolute positions) with a plain
``tokenizer.json`` loads without transformers, through
:func:`embedcache.models.families.bert.adapter.load_native_bert`: the same vectors
and key (tests/models/test_hf_bert.py). transformers' modeling imports cost seconds
of start-up. Its random-init twin still goes through transformers, whose init it
records.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from embedcache.errors import CheckpointError, UnknownModelError
from embedcache.models.shared.checkpoint import (
    Source,
    compute_dtype,
    random_init_twin,
)
from embedcache.models.shared.encoder import (
    DEFAULT_TOKEN_BUDGET,
    Encoded,
    EncoderAdapter,
    EncoderTraits,
)

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    import torch


logger = logging.getLogger(__name__)

FAMILY = "hf-encoder"
# 2: each sequence padded to the bucket of its own length, not its batch's
# longest (issue 43): fp32 bits changed; now the same in any batch
ADAPTER_VERSION = "2"
# tokenizers report this (or larger) when they know no limit
_NO_LIMIT = 10**8
# models whose learned positions start after the padding index (RoBERTa heritage)
_OFFSET_POSITIONS = frozenset({"esm", "roberta", "xlm-roberta", "camembert"})


def token_budget(hidden_size: int) -> int:
    """Padded tokens per forward pass for a generic encoder: about 2^22 activation
    values (8,192 tokens at width 512, 4,096 at 1,024), in multiples of 512, never
    below the engine's default nor above 16,384.

    Wide layers keep the matmuls busy with fewer rows. For a one-token-per-base BERT
    of width 512 (benchmarks/embed_bench.py --sweep), 8,192 beat the 1,536 tuned on
    6-mer tokens by up to 13% at 253 tokens a sequence and was within noise at 502;
    an end-to-end run took 56.5 s against 65.1 s; 32,768 was never the fastest.
    """
    tokens = (2**22 // max(hidden_size, 1)) // 512 * 512
    return min(max(tokens, DEFAULT_TOKEN_BUDGET), 16_384)


def recognise(config: dict[str, Any], folder: Path) -> bool:
    """The fallback: any config transformers can map to a native class."""
    return bool(config.get("model_type"))


def kmer_split(seq: str, k: int) -> str:
    """DNABERT-style input: overlapping k-mers joined by spaces (``ACGTA``, 3 -> ``ACG CGT GTA``)."""
    if len(seq) < k:
        return seq
    return " ".join(seq[i : i + k] for i in range(len(seq) - k + 1))


class HFTokenizer:
    """A transformers tokenizer as a :class:`SequenceTokenizer` (optionally k-mer split)."""

    def __init__(self, tokenizer: Any, *, kmer: int | None = None) -> None:  # noqa: ANN401
        self.tokenizer = tokenizer
        self.kmer = kmer
        self.pad_id = int(tokenizer.pad_token_id or 0)

    def _text(self, seq: str) -> str:
        return kmer_split(seq, self.kmer) if self.kmer else seq

    def encode(self, seq: str) -> Encoded:
        return self.encode_many([seq])[0]

    def encode_many(self, seqs: Sequence[str]) -> list[Encoded]:
        if not seqs:
            return []
        enc = self.tokenizer(
            [self._text(s) for s in seqs],
            add_special_tokens=True,
            return_special_tokens_mask=True,
        )
        return [
            Encoded(tuple(ids), tuple(bool(s) for s in special))
            for ids, special in zip(
                enc["input_ids"], enc["special_tokens_mask"], strict=True
            )
        ]


def max_tokens(config: object, tokenizer: object) -> int | None:
    """The longest input (special tokens included) the model accepts, or None if unlimited."""
    limits = []
    tok_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_max, int) and 0 < tok_max < _NO_LIMIT:
        limits.append(tok_max)
    position_type = getattr(config, "position_embedding_type", "absolute")
    n_positions = getattr(config, "max_position_embeddings", None)
    if isinstance(n_positions, int) and position_type == "absolute":
        if getattr(config, "model_type", "") in _OFFSET_POSITIONS:
            pad = getattr(config, "pad_token_id", None) or 0
            n_positions -= pad + 1
        limits.append(n_positions)
    return min(limits) if limits else None


def load(source: Source) -> EncoderAdapter:
    """A native transformers encoder from ``folder`` (weights checked strictly).

    Raises
    ------
    UnknownModelError
        transformers cannot build the config, tokenizer or model.
    CheckpointError
        The checkpoint's encoder tensors do not match the class its config names.
    """
    if source.options.random_init is None:
        from embedcache.models.families.bert.adapter import load_native_bert

        native = load_native_bert(source)
        if native is not None:
            return native
    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    folder, options = source.folder, source.options
    remote = options.trust_remote_code
    name = source.alias or source.model_id
    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=remote)
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=remote)
        if options.random_init is not None:
            torch.manual_seed(options.random_init)
            model = _without_pooler(AutoModel.from_config, config, remote=remote)
        else:
            model = _load_checked(folder, config, remote=remote, where=name)
    except CheckpointError:
        raise
    except (OSError, ValueError, KeyError) as err:
        msg = (
            f"cannot load {name!r} from {folder} as a Hugging Face encoder: {err}. "
            "Check the directory holds config.json, tokenizer files and weights."
        )
        raise UnknownModelError(msg) from err
    key_options = [("model_type", str(getattr(config, "model_type", "")))]
    if options.kmer_split is not None:
        key_options.append(("kmer_split", str(options.kmer_split)))
    if options.random_init is not None:
        source, option = random_init_twin(source)
        key_options.append(option)
    dtype = compute_dtype(options)
    from embedcache.models.families.hf.network import HFNetwork

    network = HFNetwork(model, config, causal=False).to(
        device=source.device, dtype=dtype
    )
    network = network.eval()
    limit = max_tokens(config, tokenizer)
    traits = EncoderTraits(
        family=FAMILY,
        adapter_version=ADAPTER_VERSION,
        causal=bool(getattr(config, "is_decoder", False)),
        has_cls=tokenizer.cls_token_id is not None
        or tokenizer.bos_token_id is not None,
        max_tokens=limit,
        options=tuple(key_options),
        token_budget=token_budget(int(network.hidden_size)),
        attention_heads=int(getattr(config, "num_attention_heads", 0) or 0),
    )
    return EncoderAdapter(
        HFTokenizer(tokenizer, kmer=options.kmer_split), network, traits, source
    )


def _without_pooler(build: Any, *args: Any, remote: bool) -> torch.nn.Module:  # noqa: ANN401
    """BERT/ESM-style encoders carry a [CLS] pooler we never use: skip building it."""
    import torch

    kwargs: dict[str, Any] = {"trust_remote_code": remote, "dtype": torch.float32}
    try:
        return build(*args, add_pooling_layer=False, **kwargs)
    except TypeError:
        return build(*args, **kwargs)


def _load_checked(
    folder: Path,
    config: Any,  # noqa: ANN401
    *,
    remote: bool,
    where: str,
) -> torch.nn.Module:
    from transformers import AutoModel

    # transformers logs its own load report (heads left out, a pooler skipped) and,
    # once that report is quiet, a tensor-parallel plan check that means nothing on
    # one device; the strict check below decides and names what matters
    quiet = [
        logging.getLogger(f"transformers.{name}")
        for name in ("modeling_utils", "distributed.tensor_parallel")
    ]
    levels = [log.level for log in quiet]
    for log in quiet:
        log.setLevel(logging.ERROR)
    try:
        model, info = _without_pooler(
            lambda *a, **k: AutoModel.from_pretrained(
                *a, config=config, output_loading_info=True, **k
            ),
            folder,
            remote=remote,
        )
    finally:
        for log, level in zip(quiet, levels, strict=True):
            log.setLevel(level)
    return _check_loaded(model, info, where=where)


def _check_loaded(
    model: torch.nn.Module,
    info: dict[str, Any],
    *,
    where: str,
) -> torch.nn.Module:
    own_modules = {name.split(".")[0] for name in model.state_dict()}
    prefix = getattr(model, "base_model_prefix", "") or ""
    unexpected = [
        name
        for name in info.get("unexpected_keys", ())
        if name.split(".")[0] in own_modules
        or (prefix and name.startswith(prefix + "."))
    ]
    missing = sorted(info.get("missing_keys", ()))
    mismatched = list(info.get("mismatched_keys", ()))
    if missing or unexpected or mismatched:
        cls = type(model).__name__
        parts = [
            f"{label} {len(names)} ({', '.join(str(n) for n in sorted(names)[:5])})"
            for label, names in (
                ("missing", missing),
                ("unexpected", unexpected),
                ("misshaped", mismatched),
            )
            if names
        ]
        msg = (
            f"{where}: its weights do not fit {cls}, the native class its config names: "
            f"{'; '.join(parts)}. Refusing to load it into the wrong class; it may be a "
            "model whose own code changes the architecture (a family embedcache does not "
            "know yet), or an incomplete checkpoint."
        )
        raise CheckpointError(msg)
    return model
