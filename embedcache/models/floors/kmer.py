"""Built-in floor models ``kmer-1`` .. ``kmer-6``: normalised k-mer spectra, no download.

A sequence's vector is the count of every k-mer over A/C/G/T (lexicographic order,
A < C < G < T) divided by the number of counted k-mers. K-mers containing N are
skipped; a sequence without any valid k-mer gets the zero vector.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from embedcache.errors import AdapterOptionError
from embedcache.hashing import reverse_complement
from embedcache.models.base import FloorAdapter, base_codes

if TYPE_CHECKING:
    from collections.abc import Sequence

logger = logging.getLogger(__name__)

KMER_ADAPTER_VERSION = "1"
MAX_K = 6
_RC_MODES = ("none", "average")

# byte -> base code; 4 marks N (skipped), 255 marks anything else (rejected)
_CODES = np.full(256, 255, dtype=np.uint8)
for _i, _base in enumerate(b"ACGT"):
    _CODES[_base] = _i
_CODES[ord("N")] = 4


def kmer_names(k: int) -> list[str]:
    """The k-mers in vector order: ``AA..A, AA..C, ..., TT..T``."""
    names = [""]
    for _ in range(k):
        names = [name + base for name in names for base in "ACGT"]
    return names


def kmer_spectrum(seq: str, k: int) -> np.ndarray:
    """Normalised k-mer counts of an upper-case sequence (float32, length ``4**k``).

    Raises
    ------
    InvalidSequenceError
        The sequence holds a character other than A, C, G, T or N.
    """
    return kmer_spectra([seq], k)[0]


def kmer_spectra(seqs: Sequence[str], k: int) -> np.ndarray:
    """:func:`kmer_spectrum` of each sequence, (n, ``4**k``) float32.

    A slice of sequences at a time is counted in a few passes over all its bases
    together: a server computing a batch of misses then holds the GIL for a few
    array operations, not ~15 small ones per sequence, and its hits get their turns.

    Raises
    ------
    InvalidSequenceError
        A sequence holds a character other than A, C, G, T or N (the first such).
    """
    out = np.empty((len(seqs), 4**k), np.float32)
    max_rows = max(1, _SLICE_CELLS // 4**k)
    lo = 0
    while lo < len(seqs):
        hi, bases = lo + 1, len(seqs[lo])
        while (
            hi < len(seqs)
            and hi - lo < max_rows
            and bases + len(seqs[hi]) <= _SLICE_BASES
        ):
            bases += len(seqs[hi])
            hi += 1
        out[lo:hi] = _spectra_slice(seqs[lo:hi], k)
        lo = hi
    return out


# bases and spectrum cells a slice counts at once (~8 bytes each, a few arrays)
_SLICE_BASES = 1 << 20
_SLICE_CELLS = 1 << 22


def _spectra_slice(seqs: Sequence[str], k: int) -> np.ndarray:
    lengths = np.fromiter(map(len, seqs), np.int64, len(seqs))
    # one byte per character either way (a non-ASCII one becomes "?", refused)
    raw = np.frombuffer("".join(seqs).encode("ascii", errors="replace"), np.uint8)
    codes = _CODES[raw]
    refused = np.flatnonzero(codes == 255)
    if refused.size:  # the first sequence holding one raises, naming the character
        first = int(np.searchsorted(np.cumsum(lengths), refused[0], side="right"))
        base_codes(seqs[first], _CODES, accepted_by="k-mer spectra accept")
    n_windows = len(codes) - k + 1
    counts = np.zeros((len(seqs), 4**k), np.int64)
    if n_windows > 0:
        owner = np.repeat(np.arange(len(seqs)), lengths)
        n_before = np.concatenate([[0], np.cumsum(codes == 4)])  # Ns before each base
        # a window counts if it holds no N and lies within one sequence
        valid = (n_before[k:] == n_before[:n_windows]) & (
            owner[:n_windows] == owner[k - 1 :]
        )
        index = np.zeros(n_windows, np.int64)
        for j in range(k):  # base j of each window, most significant first
            index = index * 4 + codes[j : j + n_windows]
        cell = owner[:n_windows][valid] * 4**k + index[valid]
        counts = np.bincount(cell, minlength=counts.size).reshape(counts.shape)
    totals = counts.sum(axis=1, keepdims=True)
    # divide in float64 so each row sums to 1 within float32 rounding
    spectra = np.divide(counts, totals, out=np.zeros(counts.shape), where=totals > 0)
    return spectra.astype(np.float32)


class KmerAdapter(FloorAdapter):
    """Normalised k-mer spectrum as an embedding; ``rc_mode="average"`` is strand-symmetric."""

    def __init__(self, k: int, *, rc_mode: str = "none") -> None:
        if not 1 <= k <= MAX_K:
            msg = f"kmer-{k}: k must be between 1 and {MAX_K}"
            raise AdapterOptionError(msg)
        if rc_mode not in _RC_MODES:
            msg = f"kmer-{k}: rc mode {rc_mode!r} is not one of {', '.join(_RC_MODES)}"
            raise AdapterOptionError(msg)
        super().__init__(
            f"kmer-{k}",
            adapter="kmer",
            version=KMER_ADAPTER_VERSION,
            pooling="spectrum",
            rc_mode=rc_mode,
        )
        self.k = k
        self.dim = 4**k

    def embed_batch(self, seqs: Sequence[str]) -> np.ndarray:
        out = kmer_spectra(seqs, self.k)
        if self.rc_mode == "average":
            rc = kmer_spectra([reverse_complement(seq) for seq in seqs], self.k)
            out = (out + rc) / 2
        return out
