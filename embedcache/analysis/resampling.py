"""Bootstrap resamples held as counts, and the column sums they give, per dataset.

A resample is held as counts (how often each item was drawn), so every model's score
on every resample is one matrix product of the counts with per-item columns; no
Python loop per resample. Each dataset has its own stream, fixed by seed and name.
Cluster resampling draws whole clusters (their items' columns summed) instead.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from embedcache.errors import ProbeError

if TYPE_CHECKING:
    from numpy.typing import ArrayLike, NDArray

# Resamples are generated in blocks so a 25,000-item dataset never needs a
# (1000, 25000) int64 index matrix (200 MB) at once.
_BLOCK_CELLS = 4_000_000


def dataset_rng(seed: int, dataset: str) -> np.random.Generator:
    """The generator for one dataset's resamples: fixed by seed and name only.

    So adding a model or a dataset never changes another dataset's resamples.
    """
    tag = int(hashlib.sha256(dataset.encode("utf-8")).hexdigest()[:8], 16)
    return np.random.default_rng([seed, tag])


def resample_counts(
    n: int, n_boot: int, rng: np.random.Generator
) -> Iterator[NDArray[np.float32]]:
    """Yield blocks of resample counts, shape (block, n): row b counts item draws.

    Each row sums to n (n draws with replacement). float32 holds these integer counts
    and their sums (< 2**24) exactly, and lets the products run through BLAS.
    """
    block = max(1, min(n_boot, _BLOCK_CELLS // max(n, 1)))
    for start in range(0, n_boot, block):
        b = min(block, n_boot - start)
        idx = rng.integers(0, n, size=(b, n))
        idx += (np.arange(b) * n)[:, None]
        counts = np.bincount(idx.ravel(), minlength=b * n).reshape(b, n)
        yield counts.astype(np.float32)


def unit_sums(
    cols: ArrayLike,
    *,
    n_boot: int,
    rng: np.random.Generator,
    units: ArrayLike | None = None,
) -> NDArray[np.float64]:
    """(n_boot, c) column sums of resampled items.

    Parameters
    ----------
    cols
        (n, c) per-item values (counts: 0/1 indicators and their products).
    units
        None: resample items. Otherwise (n,) integer cluster labels 0..U-1: each
        resample draws U clusters with replacement and sums their items' columns.
    """
    arr = np.asarray(cols, dtype=np.float32)
    if units is None:
        agg = arr
    else:
        labels = np.asarray(units, dtype=np.int64)
        if labels.shape != (arr.shape[0],):
            msg = (
                f"cluster labels have shape {labels.shape}; expected ({arr.shape[0]},)"
            )
            raise ProbeError(msg)
        n_units = int(labels.max()) + 1 if labels.size else 0
        agg = np.zeros((n_units, arr.shape[1]), dtype=np.float32)
        np.add.at(agg, labels, arr)
    out = np.empty((n_boot, arr.shape[1]), dtype=np.float64)
    start = 0
    for counts in resample_counts(agg.shape[0], n_boot, rng):
        out[start : start + counts.shape[0]] = counts @ agg
        start += counts.shape[0]
    return out
