"""Built-in floor model ``gc``: one feature, the sequence's GC fraction, no download.

The vector is ``(G + C) / (A + C + G + T)``: N is not counted in either count. A
sequence with no A, C, G or T (all N) gets 0.5, the uninformative middle, the way a
k-mer floor gives such a sequence its zero vector instead of failing: the probe then
scores it like any other item. GC content is the same on both strands, so there is no
reverse-complement mode. A model that only learned GC content should not look good:
this floor shows what GC alone reaches with the same probe.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from embedcache.errors import AdapterOptionError
from embedcache.models.base import FloorAdapter, packed_codes

if TYPE_CHECKING:
    from collections.abc import Sequence

logger = logging.getLogger(__name__)

GC_ADAPTER_VERSION = "1"
NO_BASES_VALUE = 0.5  # all-N sequence: neither GC- nor AT-rich

# byte -> 1 for G/C, 0 for A/T, 2 for N (not counted), 255 for anything else
_CLASS = np.full(256, 255, dtype=np.uint8)
for _base in b"AT":
    _CLASS[_base] = 0
for _base in b"GC":
    _CLASS[_base] = 1
_CLASS[ord("N")] = 2


def gc_fraction(seq: str) -> float:
    """(G + C) / (A + C + G + T) of an upper-case sequence; 0.5 when it has none of them.

    Raises
    ------
    InvalidSequenceError
        The sequence holds a character other than A, C, G, T or N.
    """
    return float(gc_fractions([seq])[0])


def gc_fractions(seqs: Sequence[str]) -> np.ndarray:
    """:func:`gc_fraction` of each sequence, float64 (n,), a slice of sequences at a
    time (:func:`~embedcache.models.base.packed_codes`).

    Raises
    ------
    InvalidSequenceError
        A sequence holds a character other than A, C, G, T or N (the first such).
    """
    out = np.empty(len(seqs))
    for lo, hi, cls, lengths in packed_codes(
        seqs,
        _CLASS,
        accepted_by="the GC floor accepts",
        max_bases=1 << 20,
        max_rows=1 << 18,
    ):
        owner = np.repeat(np.arange(hi - lo), lengths)
        counts = np.bincount(owner * 3 + cls, minlength=3 * (hi - lo)).reshape(-1, 3)
        n_bases = counts[:, 0] + counts[:, 1]
        out[lo:hi] = np.divide(
            counts[:, 1],
            n_bases,
            out=np.full(hi - lo, NO_BASES_VALUE),
            where=n_bases > 0,
        )
    return out


class GCAdapter(FloorAdapter):
    """The GC fraction as a one-dimensional embedding."""

    dim = 1

    def __init__(self, *, rc_mode: str = "none") -> None:
        if rc_mode != "none":
            msg = (
                f"gc: rc mode {rc_mode!r} does not apply; GC content is the same on "
                "both strands (drop --rc)"
            )
            raise AdapterOptionError(msg)
        super().__init__(
            "gc",
            adapter="gc",
            version=GC_ADAPTER_VERSION,
            pooling="gc-fraction",
            rc_mode=rc_mode,
        )

    def embed_batch(self, seqs: Sequence[str]) -> np.ndarray:
        return gc_fractions(seqs).astype(np.float32).reshape(len(seqs), 1)
