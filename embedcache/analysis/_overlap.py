"""Compiled all-pairs overlap of k-mer sets (numba); the engine behind the leakage audit.

Sets are rows of a CSR matrix (column = k-mer code). For every query row the kernel
walks the inverted index of the reference rows (the postings of each of its k-mers),
adding one to a per-thread counter slot of every reference row in them, then scans
the counter once: per query row, the largest Jaccard index ``|A∩B| / |union|`` and
the largest containment index ``|A∩B| / min(|A|, |B|)`` over all reference rows, and
how many reference rows reach a Jaccard threshold. Everything is exact: no sketch, no
sampling.

Cost is the sum over query k-mers of their posting lengths (about 10**9 small-integer
increments per strand at 25,000 x 75,000 sequences of 200 bp) plus one pass over the
counter per query row; memory is the index and one counter a thread. A dense
(block, n_ref) float product, the method this replaced, needs gigabytes a block there.
"""

# ruff: noqa: ANN001, ANN202 (numba kernels take untyped arrays)
from __future__ import annotations

import numba
import numpy as np

# Exact division (no reciprocal approximation): a Jaccard of exactly 0.9 stays 0.9.
# reassoc lets the max and count reductions over the counter vectorise.
_FASTMATH = {"nnan", "ninf", "nsz", "reassoc"}


@numba.njit(inline="always")
def _count_row(i, q_ptr, q_idx, post_ptr, post_rows, cnt):
    """Add query row i's shared k-mers to ``cnt`` (one slot per reference row).

    No branch in the inner loop: most reference rows are first met here, so a
    "first touch?" test would mispredict half the time.
    """
    for p in range(q_ptr[i], q_ptr[i + 1]):
        v = q_idx[p]
        for s in range(post_ptr[v], post_ptr[v + 1]):
            cnt[post_rows[s]] += 1


@numba.njit(parallel=True, cache=True, nogil=True, fastmath=_FASTMATH)
def best_overlap(query, index, threshold, skip_diagonal, n_chunks):
    """Per query row: max Jaccard, max containment, and rows with Jaccard >= threshold.

    ``query`` is a CSR ``(indptr, indices)``; ``index`` the reference rows' inverted
    index ``(postings_ptr, postings_rows, sizes, n_rows)``. ``skip_diagonal`` ignores
    reference row i for query row i (a set against itself). Query rows are split into
    ``n_chunks`` parallel chunks, each with its own counter, which is scanned in full
    after each row (a sequential, vectorised pass).
    """
    q_ptr, q_idx = query
    post_ptr, post_rows, ref_size, n_ref = index
    n_q = q_ptr.shape[0] - 1
    best_j = np.zeros(n_q, dtype=np.float64)
    best_c = np.zeros(n_q, dtype=np.float64)
    n_hits = np.zeros(n_q, dtype=np.int64)
    n_chunks = max(1, min(n_q, n_chunks))
    for c in numba.prange(n_chunks):
        cnt = np.zeros(n_ref, dtype=np.int32)
        for i in range(c * n_q // n_chunks, (c + 1) * n_q // n_chunks):
            a = q_ptr[i + 1] - q_ptr[i]
            if a == 0:
                continue  # no k-mer: shares nothing
            _count_row(i, q_ptr, q_idx, post_ptr, post_rows, cnt)
            if skip_diagonal:
                cnt[i] = 0
            bj = 0.0
            bc = 0.0
            hits = 0
            for j in range(n_ref):
                inter = cnt[j]
                b = ref_size[j]
                jac = inter / (a + b - inter)  # a >= 1, so never 0 / 0
                con = inter / max(min(a, b), 1)  # b == 0 means inter == 0
                bj = max(bj, jac)
                bc = max(bc, con)
                hits += jac >= threshold
                cnt[j] = 0
            best_j[i] = bj
            best_c[i] = bc
            n_hits[i] = hits
    return best_j, best_c, n_hits


@numba.njit(cache=True, nogil=True)
def threshold_pairs(rows, query, index, threshold, skip_diagonal, n_pairs):
    """(query row, reference row) pairs with Jaccard >= threshold, for the given rows.

    ``query``, ``index`` and the rest as :func:`best_overlap`; ``n_pairs`` is their
    total, known from :func:`best_overlap`'s counts.
    """
    q_ptr, q_idx = query
    post_ptr, post_rows, ref_size, n_ref = index
    out_q = np.empty(n_pairs, dtype=np.int64)
    out_r = np.empty(n_pairs, dtype=np.int64)
    cnt = np.zeros(n_ref, dtype=np.int32)
    k = 0
    for i in rows:
        a = q_ptr[i + 1] - q_ptr[i]
        if a == 0:
            continue
        _count_row(i, q_ptr, q_idx, post_ptr, post_rows, cnt)
        if skip_diagonal:
            cnt[i] = 0
        for j in range(n_ref):
            inter = cnt[j]
            if inter and inter / (a + ref_size[j] - inter) >= threshold and k < n_pairs:
                out_q[k] = i
                out_r[k] = j
                k += 1
            cnt[j] = 0
    return out_q[:k], out_r[:k]


@numba.njit(cache=True, nogil=True)
def kmer_sets(codes, starts, ends, k):
    """CSR (indptr, indices) of the distinct k-mers of each sequence (unsorted rows).

    ``codes`` holds 0-3 for A/C/G/T and 4 for anything else; sequence i is
    ``codes[starts[i]:ends[i]]``. A window holding a 4 is skipped.
    """
    n = starts.shape[0]
    total = 0
    for i in range(n):
        total += max(ends[i] - starts[i] - k + 1, 0)
    indices = np.empty(total, dtype=np.int64)
    indptr = np.zeros(n + 1, dtype=np.int64)
    stamp = np.full(4**k, -1, dtype=np.int64)
    low = 4 ** (k - 1) - 1  # keeps the last k - 1 bases of the rolling code
    pos = 0
    for i in range(n):
        value = 0
        valid = 0  # length of the run of valid bases ending here
        for p in range(starts[i], ends[i]):
            c = codes[p]
            if c > 3:
                valid = 0
                value = 0
                continue
            value = ((value & low) << 2) | c
            valid += 1
            if valid >= k and stamp[value] != i:
                stamp[value] = i
                indices[pos] = value
                pos += 1
        indptr[i + 1] = pos
    return indptr, indices[:pos].copy()
