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
from embedcache.models.base import FloorAdapter, packed_codes

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
    """:func:`kmer_spectrum` of each sequence, (n, ``4**k``) float32, a slice of
    sequences at a time (:func:`~embedcache.models.base.packed_codes`).

    Raises
    ------
    InvalidSequenceError
        A sequence holds a character other than A, C, G, T or N (the first such).
    """
    out = np.empty((len(seqs), 4**k), np.float32)
    for lo, hi, codes, lengths in packed_codes(
        seqs,
        _CODES,
        accepted_by="k-mer spectra accept",
        max_bases=_SLICE_BASES,
        max_rows=max(1, _SLICE_CELLS // 4**k),
    ):
        out[lo:hi] = _spectra(codes, lengths, k)
    return out


# bases and spectrum cells a slice counts at once (~8 bytes each, a few arrays)
_SLICE_BASES = 1 << 20
_SLICE_CELLS = 1 << 22


def _spectra(codes: np.ndarray, lengths: np.ndarray, k: int) -> np.ndarray:
    """Spectra of the sequences whose codes are concatenated in ``codes``."""
    n_windows = len(codes) - k + 1
    counts = np.zeros((len(lengths), 4**k), np.int64)
    if n_windows > 0:
        owner = np.repeat(np.arange(len(lengths)), lengths)
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
