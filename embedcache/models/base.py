"""The small interface every model family implements."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np

    from embedcache.specs import ModelKey


# Padded tokens (longest item x batch size) per forward pass when an adapter names no
# budget of its own (``preferred_token_budget``). Measured with benchmarks/embed_bench.py
# on an NT-v2-50M-shaped encoder in bf16 (251/500 bp): batches of ~1-1.5k tokens ran at
# ~60% of the one-thread bf16 matmul peak; fewer tokens per batch pay per-call overhead.
DEFAULT_TOKEN_BUDGET = 1536


@runtime_checkable
class Adapter(Protocol):
    """Turns normalised (upper-case) DNA sequences into pooled float32 vectors.

    The engine handles store lookups, ordering and batching; an adapter only embeds.
    """

    key: ModelKey
    dim: int
    max_tokens: int | None  # None: no limit
    needs_equal_lengths: (
        bool  # no attention mask: batch only sequences of equal token count
    )

    def n_tokens(self, seq: str) -> int:
        """Tokens the model sees for ``seq`` (for the length check and the token budget)."""
        ...

    def embed_batch(self, seqs: Sequence[str]) -> np.ndarray:
        """Return float32 vectors of shape (len(seqs), dim), one per sequence, in order."""
        ...
