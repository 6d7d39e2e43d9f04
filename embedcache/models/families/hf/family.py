"""The hf-encoder family's name, adapter version and rules (token budget, longest
input, k-mer input): what its transformers path (``adapter``) and the native BERT path
(``bert.adapter``) share, below both so that neither imports the other's module."""

from __future__ import annotations

from embedcache.models.shared.encoder import DEFAULT_TOKEN_BUDGET

FAMILY = "hf-encoder"
# 2: each sequence padded to the bucket of its own length, not its batch's
# longest: fp32 bits changed; now the same in any batch
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


def kmer_split(seq: str, k: int) -> str:
    """DNABERT-style input: overlapping k-mers joined by spaces (``ACGTA``, 3 -> ``ACG CGT GTA``)."""
    if len(seq) < k:
        return seq
    return " ".join(seq[i : i + k] for i in range(len(seq) - k + 1))


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
