"""The small interface every model family implements."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from embedcache.errors import InvalidSequenceError
from embedcache.specs import ModelKey

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence


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


class FloorAdapter:
    """What the built-in floors (k-mer spectra, GC fraction) share: exact counting in
    numpy, one token per base, any length, a key without a download behind it."""

    needs_equal_lengths = False
    max_tokens = None
    # counting is microseconds a sequence: large batches keep store commits rare
    preferred_token_budget = 2_000_000

    def __init__(
        self, model_id: str, *, adapter: str, version: str, pooling: str, rc_mode: str
    ) -> None:
        self.rc_mode = rc_mode
        self.key = ModelKey(
            model_id=model_id,
            revision=f"builtin-v{version}",
            adapter=adapter,
            adapter_version=version,
            pooling=pooling,
            special_tokens="none",
            rc_mode=rc_mode,
            dtype="float32",
            max_length=None,
        )

    def n_tokens(self, seq: str) -> int:
        """One token per base: the budget is only a batching hint here."""
        return len(seq)


def base_codes(seq: str, table: np.ndarray, *, accepted_by: str) -> np.ndarray:
    """``table`` (256 entries, 255 for a refused byte) looked up for each character
    of ``seq``.

    Raises
    ------
    InvalidSequenceError
        A character maps to 255; the message ends "``accepted_by`` A, C, G, T and N".
    """
    codes = table[np.frombuffer(seq.encode("ascii", errors="replace"), dtype=np.uint8)]
    bad = np.flatnonzero(codes == 255)
    if bad.size:
        pos = int(bad[0])
        msg = (
            f"invalid character {seq[pos]!r} at position {pos + 1} of a sequence of "
            f"length {len(seq)}; {accepted_by} A, C, G, T and N"
        )
        raise InvalidSequenceError(msg)
    return codes


def packed_codes(
    seqs: Sequence[str],
    table: np.ndarray,
    *,
    accepted_by: str,
    max_bases: int,
    max_rows: int,
) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """``seqs`` a slice at a time, each character looked up in ``table``: yields
    ``(lo, hi, codes, lengths)`` for ``seqs[lo:hi]``, their codes concatenated.

    A slice holds at most ``max_rows`` sequences and ``max_bases`` bases (or one
    longer sequence). A floor counts a slice in a few array passes: a batch's work
    is then a few operations, not a few calls a sequence, each a moment of the GIL
    that a server's other threads (its hits) wait out.

    Raises
    ------
    InvalidSequenceError
        As :func:`base_codes`, for the first sequence holding a refused character.
    """
    lo = 0
    while lo < len(seqs):
        hi, bases = lo + 1, len(seqs[lo])
        while (
            hi < len(seqs) and hi - lo < max_rows and bases + len(seqs[hi]) <= max_bases
        ):
            bases += len(seqs[hi])
            hi += 1
        part = seqs[lo:hi]
        lengths = np.fromiter(map(len, part), np.int64, hi - lo)
        # one byte a character either way (a non-ASCII one becomes "?", refused)
        raw = "".join(part).encode("ascii", errors="replace")
        codes = table[np.frombuffer(raw, np.uint8)]
        refused = np.flatnonzero(codes == 255)
        if refused.size:  # raise as base_codes does for that one sequence
            first = int(np.searchsorted(np.cumsum(lengths), refused[0], side="right"))
            base_codes(part[first], table, accepted_by=accepted_by)
        yield lo, hi, codes, lengths
        lo = hi
