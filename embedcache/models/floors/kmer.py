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
    codes = base_codes(seq, _CODES, accepted_by="k-mer spectra accept")
    spectrum = np.zeros(4**k, dtype=np.float64)
    if len(codes) < k:
        return spectrum.astype(np.float32)
    windows = np.lib.stride_tricks.sliding_window_view(codes, k)
    valid = (windows < 4).all(axis=1)
    if not valid.any():
        return spectrum.astype(np.float32)
    weights = 4 ** np.arange(k - 1, -1, -1, dtype=np.int64)
    index = windows[valid].astype(np.int64) @ weights
    counts = np.bincount(index, minlength=4**k)
    # divide in float64 so each row sums to 1 within float32 rounding
    return (counts / counts.sum()).astype(np.float32)


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
        out = np.empty((len(seqs), self.dim), dtype=np.float32)
        for row, seq in enumerate(seqs):
            spectrum = kmer_spectrum(seq, self.k)
            if self.rc_mode == "average":
                rc_spectrum = kmer_spectrum(reverse_complement(seq), self.k)
                spectrum = (spectrum + rc_spectrum) / 2
            out[row] = spectrum
        return out
