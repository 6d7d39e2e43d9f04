"""Leakage audit: how much of a dataset's test set is (nearly) present in its drawn train.

Per test item, flags against the train items drawn for the same dataset:

- exact: the upper-cased sequence equals a train sequence;
- reverse complement: its reverse complement equals a train sequence;
- near (the rule that defines *clean* items): exact Jaccard similarity of 8-mer
  *sets* >= 0.9 with some train sequence, on either strand (the test sequence or its
  reverse complement against train); k-mers holding N are skipped. An exact or
  reverse-complement duplicate is also near;
- containment (a second, reported rate): ``|A∩B| / min(|A|, |B|) >= 0.9`` on either
  strand, same k-mer sets; it also catches a short window inside a longer one.

Every (test, train) pair is compared exactly (:mod:`embedcache.analysis._overlap`). The
optional full-train audit applies the same rules against the dataset's whole
published train file: context for fine-tuned comparisons, never used in scoring.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numba
import numpy as np
import polars as pl
from scipy import sparse

from embedcache.analysis._overlap import best_overlap, kmer_sets, threshold_pairs
from embedcache.errors import DataUnavailableError
from embedcache.hashing import normalise_sequence, reverse_complement

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from embedcache.data.subsets import Subset

logger = logging.getLogger(__name__)

K = 8
THRESHOLD = 0.9
METHOD = f"exact Jaccard of {K}-mer sets >= {THRESHOLD}, either strand, N-holding k-mers skipped"
CONTAINMENT_METHOD = (
    f"containment |A∩B| / min(|A|, |B|) of {K}-mer sets >= {THRESHOLD}, either strand"
)

_CODE = np.full(256, 4, dtype=np.uint8)
for _i, _b in enumerate(b"ACGT"):
    _CODE[_b] = _i
    _CODE[_b + 32] = _i  # lower case


def _codes(seqs: Sequence[str]) -> tuple[NDArray[np.uint8], NDArray[np.int64]]:
    """All sequences' base codes joined, and where each one starts (n + 1 offsets)."""
    joined = np.frombuffer(
        "".join(seqs).encode("ascii", errors="replace"), dtype=np.uint8
    )
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    return _CODE[joined], np.concatenate([[0], np.cumsum(lengths)])


def kmer_set_matrix(seqs: Sequence[str], *, k: int = K) -> sparse.csr_matrix:
    """Binary (n, 4**k) CSR matrix: row i marks the distinct k-mers of seqs[i].

    Windows holding N (or any other non-ACGT character) are skipped. Column indices
    are in order of first occurrence within a row (CSR allows that; call
    ``sort_indices()`` where sorted rows are needed).
    """
    n = len(seqs)
    if n == 0:
        return sparse.csr_matrix((0, 4**k), dtype=np.float32)
    codes, offsets = _codes(seqs)
    indptr, indices = kmer_sets(codes, offsets[:-1], offsets[1:], k)
    data = np.ones(indices.size, dtype=np.float32)
    return sparse.csr_matrix((data, indices, indptr), shape=(n, 4**k))


def _rc_codes(k: int) -> NDArray[np.int64]:
    """For each k-mer code, the code of its reverse complement."""
    codes = np.arange(4**k, dtype=np.int64)
    out = np.zeros_like(codes)
    for _ in range(k):
        out = out * 4 + (3 - codes % 4)
        codes //= 4
    return out


def reverse_complement_sets(
    sets: sparse.csr_matrix, *, k: int = K
) -> sparse.csr_matrix:
    """The k-mer sets of the reverse complements: each k-mer mapped to its own.

    Equal to :func:`kmer_set_matrix` of the reverse-complemented sequences (a window
    of rc(s) is the reverse complement of a window of s), without re-encoding them.
    """
    out = sets.copy()
    out.indices = _rc_codes(k)[sets.indices].astype(sets.indices.dtype)
    out.has_sorted_indices = False
    out.sort_indices()
    return out


@dataclass(frozen=True)
class KmerIndex:
    """Reference k-mer sets as an inverted index (k-mer -> rows holding it)."""

    postings_ptr: NDArray[np.int64]
    postings_rows: NDArray[np.int32]
    sizes: NDArray[np.int64]  # distinct k-mers per row

    @classmethod
    def build(cls, sets: sparse.csr_matrix) -> KmerIndex:
        csc = sets.tocsc()
        csc.sort_indices()
        return cls(
            csc.indptr.astype(np.int64),
            csc.indices.astype(np.int32),  # half the bytes streamed per posting
            np.diff(sets.indptr).astype(np.int64),
        )

    @property
    def n_rows(self) -> int:
        return int(self.sizes.shape[0])


@dataclass(frozen=True)
class Overlap:
    """Per query row: its best match among the reference rows."""

    max_jaccard: NDArray[np.float64]
    max_containment: NDArray[np.float64]
    n_near: NDArray[np.int64]  # reference rows with Jaccard >= the threshold


def overlap(
    query: sparse.csr_matrix,
    ref: sparse.csr_matrix | KmerIndex,
    *,
    threshold: float = THRESHOLD,
    skip_diagonal: bool = False,
) -> Overlap:
    """Exact best Jaccard and containment of each query set against every reference set.

    ``skip_diagonal`` ignores reference row i for query row i (query and reference are
    the same items, e.g. a test set against itself).
    """
    index = ref if isinstance(ref, KmerIndex) else KmerIndex.build(ref)
    n_q = query.shape[0]
    if n_q == 0 or index.n_rows == 0:
        zeros = np.zeros(n_q, dtype=np.float64)
        return Overlap(zeros, zeros.copy(), np.zeros(n_q, dtype=np.int64))
    best_j, best_c, n_near = best_overlap(
        *_kernel_args(query, index, threshold, skip_diagonal=skip_diagonal),
        8 * numba.get_num_threads(),  # several chunks a thread: rows differ in cost
    )
    return Overlap(best_j, best_c, n_near)


def near_pairs(
    query: sparse.csr_matrix,
    ref: sparse.csr_matrix | KmerIndex,
    *,
    threshold: float = THRESHOLD,
    skip_diagonal: bool = False,
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Every (query row, reference row) pair whose k-mer sets have Jaccard >= threshold."""
    index = ref if isinstance(ref, KmerIndex) else KmerIndex.build(ref)
    found = overlap(query, index, threshold=threshold, skip_diagonal=skip_diagonal)
    rows = np.flatnonzero(found.n_near).astype(np.int64)
    if rows.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty.copy()
    return threshold_pairs(
        rows,
        *_kernel_args(query, index, threshold, skip_diagonal=skip_diagonal),
        int(found.n_near.sum()),
    )


def _kernel_args(
    query: sparse.csr_matrix,
    index: KmerIndex,
    threshold: float,
    *,
    skip_diagonal: bool,
) -> tuple[Any, ...]:
    """What both overlap kernels take, in order: query CSR, index, threshold, diagonal."""
    csr = (query.indptr.astype(np.int64), query.indices.astype(np.int64))
    postings = (index.postings_ptr, index.postings_rows, index.sizes, index.n_rows)
    return csr, postings, float(threshold), skip_diagonal


def max_jaccard(
    test: sparse.csr_matrix, train: sparse.csr_matrix
) -> NDArray[np.float64]:
    """Per test row, the largest Jaccard similarity with any train row (0 if none)."""
    return overlap(test, train).max_jaccard


@dataclass(frozen=True)
class LeakageFlags:
    """Per test item flags of one dataset."""

    exact: NDArray[np.bool_]
    reverse_complement: NDArray[np.bool_]
    near: NDArray[np.bool_]
    max_jaccard: NDArray[np.float64]
    containment: NDArray[np.bool_]
    max_containment: NDArray[np.float64]

    @property
    def clean(self) -> NDArray[np.bool_]:
        """Items with no exact, reverse-complement or near duplicate."""
        return ~self.near


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
    index = KmerIndex.build(kmer_set_matrix(train_n, k=k))
    test_sets = kmer_set_matrix(test_n, k=k)
    fwd = overlap(test_sets, index, threshold=threshold)
    rev = overlap(reverse_complement_sets(test_sets, k=k), index, threshold=threshold)
    best = np.maximum(fwd.max_jaccard, rev.max_jaccard)
    best_c = np.maximum(fwd.max_containment, rev.max_containment)
    # An identical sequence is a duplicate even when it is too short for one k-mer.
    identical = exact | rc
    near = (best >= threshold) | identical
    contained = (best_c >= threshold) | identical
    return LeakageFlags(exact, rc, near, best, contained, best_c)


@dataclass(frozen=True)
class DatasetAudit:
    """One dataset's test items (in the subset's order) and their flags."""

    dataset: str
    item_ids: tuple[str, ...]
    n_train: int
    flags: LeakageFlags

    @property
    def clean(self) -> NDArray[np.bool_]:
        return self.flags.clean


def audit_datasets(
    items: pl.DataFrame, *, k: int = K, threshold: float = THRESHOLD
) -> dict[str, DatasetAudit]:
    """Flags of every dataset's test items against its drawn train items.

    ``items`` has columns dataset, split ("train"/"test") and seq (and item_id, which
    is kept so flags can be matched to scored items).
    """
    out: dict[str, DatasetAudit] = {}
    for dataset in sorted(items["dataset"].unique().to_list()):
        part = items.filter(pl.col("dataset") == dataset)
        train = part.filter(pl.col("split") == "train")["seq"].to_list()
        test = part.filter(pl.col("split") == "test")
        ids = (
            tuple(test["item_id"].to_list())
            if "item_id" in test.columns
            else tuple(str(i) for i in range(test.height))
        )
        flags = audit_sequences(train, test["seq"].to_list(), k=k, threshold=threshold)
        out[dataset] = DatasetAudit(dataset, ids, len(train), flags)
        logger.info(
            "leakage %s: %d exact, %d rc, %d near, %d contained of %d test items",
            dataset,
            int(flags.exact.sum()),
            int(flags.reverse_complement.sum()),
            int(flags.near.sum()),
            int(flags.containment.sum()),
            test.height,
        )
    return out


def audit_table(audits: Mapping[str, DatasetAudit]) -> pl.DataFrame:
    """The audit as one row per dataset: counts and shares of the test items."""
    rows = []
    for name, audit in audits.items():
        f = audit.flags
        n_test = len(audit.item_ids)
        n = max(n_test, 1)
        rows.append(
            {
                "dataset": name,
                "n_test": n_test,
                "n_train": audit.n_train,
                "exact_dup": int(f.exact.sum()),
                "rc_dup": int(f.reverse_complement.sum()),
                "near_dup": int(f.near.sum()),
                "contained_dup": int(f.containment.sum()),
                "n_clean": int(f.clean.sum()),
                "exact_share": f.exact.sum() / n,
                "rc_share": f.reverse_complement.sum() / n,
                "near_share": f.near.sum() / n,
                "contained_share": f.containment.sum() / n,
            }
        )
    return pl.DataFrame(rows)


def audit_items(
    items: pl.DataFrame, *, k: int = K, threshold: float = THRESHOLD
) -> pl.DataFrame:
    """Leakage table of a drawn subset: one row per dataset (see :func:`audit_table`)."""
    return audit_table(audit_datasets(items, k=k, threshold=threshold))


FULL_TRAIN_COLUMNS = {
    "dataset": pl.Utf8,
    "n_test": pl.Int64,
    "n_full_train": pl.Int64,
    "source": pl.Utf8,
    "exact_dup": pl.Int64,
    "rc_dup": pl.Int64,
    "near_dup": pl.Int64,
    "contained_dup": pl.Int64,
    "near_share": pl.Float64,
    "contained_share": pl.Float64,
}


def full_train_audit(
    subset: Subset,
    *,
    data_dir: object = None,
    k: int = K,
    threshold: float = THRESHOLD,
) -> pl.DataFrame:
    """Test items with a duplicate anywhere in the dataset's full published train file.

    Context for comparisons with fine-tuned models (which train on that whole file);
    never used in scoring. A version drawn from the published train split has read it
    already (``subset.sources``); for a self-split version the train split is looked for
    at the version's own source (the bundled demo data has none). A dataset whose
    train file is not available gets a row with ``n_full_train`` null.
    """
    from embedcache.data.datasets import load_split

    rows = []
    for draw in subset.version.datasets:
        test = subset.items.filter(
            (pl.col("dataset") == draw.name) & (pl.col("split") == "test")
        )["seq"].to_list()
        train_data = next(
            (
                s
                for s in subset.sources
                if s.dataset == draw.name
                and s.split == draw.train_split
                and not draw.self_split
            ),
            None,
        )
        if train_data is None:
            try:
                train_data = load_split(
                    draw.name, "train", data_dir=data_dir, source=draw.source
                )
            except DataUnavailableError as err:
                logger.info("full-train audit of %s skipped: %s", draw.name, err)
        row: dict[str, object] = dict.fromkeys(FULL_TRAIN_COLUMNS)
        row.update(dataset=draw.name, n_test=len(test))
        if train_data is not None:
            flags = audit_sequences(
                train_data.frame["seq"].to_list(), test, k=k, threshold=threshold
            )
            n = max(len(test), 1)
            row.update(
                n_full_train=train_data.frame.height,
                source=train_data.source,
                exact_dup=int(flags.exact.sum()),
                rc_dup=int(flags.reverse_complement.sum()),
                near_dup=int(flags.near.sum()),
                contained_dup=int(flags.containment.sum()),
                near_share=float(flags.near.sum() / n),
                contained_share=float(flags.containment.sum() / n),
            )
        rows.append(row)
    return pl.DataFrame(rows, schema=FULL_TRAIN_COLUMNS)
