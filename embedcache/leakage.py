"""Leakage audit: how much of a dataset's test set is (nearly) present in its drawn train.

Per test item, three flags against the train items drawn for the same dataset:

- exact: the upper-cased sequence equals a train sequence;
- reverse complement: its reverse complement equals a train sequence;
- near: exact Jaccard similarity of 8-mer *sets* >= 0.9 with some train sequence,
  on either strand (the test sequence or its reverse complement against train);
  k-mers holding N are skipped. Jaccard is computed exactly for every (test, train)
  pair with one sparse matrix product per block of test items.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl
from scipy import sparse

from embedcache.hashing import normalise_sequence, reverse_complement

if TYPE_CHECKING:
    from numpy.typing import NDArray

logger = logging.getLogger(__name__)

K = 8
THRESHOLD = 0.9
METHOD = f"exact Jaccard of {K}-mer sets >= {THRESHOLD}, either strand, N-holding k-mers skipped"
_BLOCK = 4096  # test rows per sparse product: bounds the dense (block, n_train) result

_CODE = np.full(256, 4, dtype=np.uint8)
for _i, _b in enumerate(b"ACGT"):
    _CODE[_b] = _i
    _CODE[_b + 32] = _i  # lower case


def kmer_set_matrix(seqs: Sequence[str], *, k: int = K) -> sparse.csr_matrix:
    """Binary (n, 4**k) CSR matrix: row i marks the distinct k-mers of seqs[i].

    All sequences are encoded at once: they are joined with an invalid separator,
    so a window crossing two sequences contains it and is dropped like one with N.
    """
    n = len(seqs)
    if n == 0:
        return sparse.csr_matrix((0, 4**k), dtype=np.float32)
    joined = np.frombuffer(("|".join(seqs) + "|").encode("ascii"), dtype=np.uint8)
    codes = _CODE[joined].astype(np.int64)
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=n)
    starts = np.concatenate([[0], np.cumsum(lengths + 1)[:-1]])
    n_win = joined.size - k + 1
    if n_win <= 0:
        return sparse.csr_matrix((n, 4**k), dtype=np.float32)
    invalid = np.concatenate([[0], np.cumsum(codes == 4)])
    ok = (invalid[k:] - invalid[:-k])[:n_win] == 0
    value = np.zeros(n_win, dtype=np.int64)
    for j in range(k):
        value = value * 4 + np.minimum(codes[j : j + n_win], 3)
    row = np.searchsorted(starts, np.arange(n_win), side="right") - 1
    mat = sparse.csr_matrix(
        (np.ones(int(ok.sum()), dtype=np.float32), (row[ok], value[ok])),
        shape=(n, 4**k),
    )
    mat.sum_duplicates()
    mat.data[:] = 1.0  # a set, not a spectrum
    return mat


def max_jaccard(
    test: sparse.csr_matrix, train: sparse.csr_matrix
) -> NDArray[np.float64]:
    """Per test row, the largest Jaccard similarity with any train row (0 if none)."""
    out = np.zeros(test.shape[0], dtype=np.float64)
    if train.shape[0] == 0 or test.shape[0] == 0:
        return out
    size_train = np.asarray(train.getnnz(axis=1), dtype=np.float64)
    train_t = train.T.tocsc()
    for start in range(0, test.shape[0], _BLOCK):
        block = test[start : start + _BLOCK]
        inter = (block @ train_t).toarray().astype(np.float64)
        size_test = np.asarray(block.getnnz(axis=1), dtype=np.float64)
        union = size_test[:, None] + size_train[None, :] - inter
        jac = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
        out[start : start + block.shape[0]] = jac.max(axis=1)
    return out


@dataclass(frozen=True)
class LeakageFlags:
    """Per test item flags of one dataset."""

    exact: NDArray[np.bool_]
    reverse_complement: NDArray[np.bool_]
    near: NDArray[np.bool_]
    max_jaccard: NDArray[np.float64]


def audit_sequences(
    train: Sequence[str],
    test: Sequence[str],
    *,
    k: int = K,
    threshold: float = THRESHOLD,
) -> LeakageFlags:
    """Flag test sequences duplicated (exactly, as reverse complement, or nearly) in train."""
    train_n = [normalise_sequence(s) for s in train]
    test_n = [normalise_sequence(s) for s in test]
    train_set = set(train_n)
    test_rc = [reverse_complement(s) for s in test_n]
    exact = np.fromiter((s in train_set for s in test_n), dtype=bool, count=len(test_n))
    rc = np.fromiter((s in train_set for s in test_rc), dtype=bool, count=len(test_n))
    train_m = kmer_set_matrix(train_n, k=k)
    best = np.maximum(
        max_jaccard(kmer_set_matrix(test_n, k=k), train_m),
        max_jaccard(kmer_set_matrix(test_rc, k=k), train_m),
    )
    # An identical sequence is a duplicate even when it is too short for one k-mer.
    near = (best >= threshold) | exact | rc
    return LeakageFlags(exact, rc, near, best)


def audit_items(
    items: pl.DataFrame, *, k: int = K, threshold: float = THRESHOLD
) -> pl.DataFrame:
    """Leakage table of a drawn subset: one row per dataset.

    ``items`` has columns dataset, split ("train"/"test") and seq. Shares are of the
    dataset's test items.
    """
    rows = []
    for dataset in sorted(items["dataset"].unique().to_list()):
        part = items.filter(pl.col("dataset") == dataset)
        train = part.filter(pl.col("split") == "train")["seq"].to_list()
        test = part.filter(pl.col("split") == "test")["seq"].to_list()
        flags = audit_sequences(train, test, k=k, threshold=threshold)
        n = max(len(test), 1)
        rows.append(
            {
                "dataset": dataset,
                "n_test": len(test),
                "n_train": len(train),
                "exact_dup": int(flags.exact.sum()),
                "rc_dup": int(flags.reverse_complement.sum()),
                "near_dup": int(flags.near.sum()),
                "exact_share": flags.exact.sum() / n,
                "rc_share": flags.reverse_complement.sum() / n,
                "near_share": flags.near.sum() / n,
            }
        )
        logger.info(
            "leakage %s: %d exact, %d rc, %d near of %d test items",
            dataset,
            rows[-1]["exact_dup"],
            rows[-1]["rc_dup"],
            rows[-1]["near_dup"],
            len(test),
        )
    return pl.DataFrame(rows)
