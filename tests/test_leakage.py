from __future__ import annotations

import itertools

import numpy as np
import polars as pl
import pytest

from embedcache.hashing import reverse_complement
from embedcache.leakage import (
    audit_items,
    audit_sequences,
    kmer_set_matrix,
    max_jaccard,
)


def _random_seqs(n, length, seed):
    rng = np.random.default_rng(seed)
    return ["".join(rng.choice(list("ACGT"), length)) for _ in range(n)]


def _kmers(seq, k):
    return {
        seq[i : i + k] for i in range(len(seq) - k + 1) if "N" not in seq[i : i + k]
    }


def _jaccard(a, b, k=8):
    sa, sb = _kmers(a.upper(), k), _kmers(b.upper(), k)
    return len(sa & sb) / len(sa | sb) if sa | sb else 0.0


def test_kmer_set_matrix_rows_are_the_distinct_kmers():
    seqs = ["ACGTACGTAC", "AAAAAAAA", "ACGNACGTACGTT", "AC", "acgtacgtac"]
    mat = kmer_set_matrix(seqs, k=3)
    alphabet = ["".join(p) for p in itertools.product("ACGT", repeat=3)]
    for i, seq in enumerate(seqs):
        cols = mat[i].indices
        assert {alphabet[c] for c in cols} == _kmers(seq.upper(), 3)
        assert set(mat[i].data.tolist()) <= {1.0}


def test_max_jaccard_equals_pairwise_python():
    train = _random_seqs(15, 60, 0)
    test = _random_seqs(10, 60, 1)
    test[0] = train[3][:55] + "ACGTA"  # a near copy
    got = max_jaccard(kmer_set_matrix(test), kmer_set_matrix(train))
    want = [max(_jaccard(t, r) for r in train) for t in test]
    np.testing.assert_allclose(got, want)
    assert got[0] > 0.7


def test_audit_flags_exact_rc_and_near_duplicates():
    train = _random_seqs(20, 200, 2)
    test = _random_seqs(8, 200, 3)
    test[0] = train[0].lower()  # exact after upper-casing
    test[1] = reverse_complement(train[1])  # reverse complement
    test[2] = train[2][:199] + (
        "A" if train[2][199] != "A" else "C"
    )  # one base changed
    test[3] = reverse_complement(
        train[3][:199] + ("A" if train[3][199] != "A" else "C")
    )
    test[4] = train[4][:150] + _random_seqs(1, 50, 9)[0]  # 75% shared: not near
    flags = audit_sequences(train, test)
    assert flags.exact.tolist() == [True] + [False] * 7
    assert flags.reverse_complement.tolist() == [False, True] + [False] * 6
    assert flags.near.tolist() == [True, True, True, True] + [False] * 4
    assert flags.max_jaccard[2] == pytest.approx(_jaccard(test[2], train[2]))
    assert flags.max_jaccard[4] < 0.9


def test_audit_items_table_per_dataset():
    train = _random_seqs(10, 100, 4)
    test = _random_seqs(4, 100, 5)
    test[0] = train[0]
    frame = pl.DataFrame(
        {
            "dataset": ["a"] * 14 + ["b"] * 3,
            "split": ["train"] * 10 + ["test"] * 4 + ["train", "test", "test"],
            "seq": [*train, *test, "ACGTACGTAAAA", "ACGTACGTAAAA", "NNNN"],
        }
    )
    table = audit_items(frame)
    assert table["dataset"].to_list() == ["a", "b"]
    a = table.row(0, named=True)
    assert (a["n_test"], a["n_train"], a["exact_dup"], a["near_dup"]) == (4, 10, 1, 1)
    assert a["exact_share"] == pytest.approx(0.25)
    b = table.row(1, named=True)
    assert (b["exact_dup"], b["near_dup"], b["near_share"]) == (1, 1, 0.5)
