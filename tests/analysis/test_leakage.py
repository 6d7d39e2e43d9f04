from __future__ import annotations

import itertools

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embedcache.analysis.leakage import (
    audit_datasets,
    audit_items,
    audit_sequences,
    full_train_audit,
    kmer_set_matrix,
    max_jaccard,
    near_pairs,
    overlap,
    reverse_complement_sets,
)
from embedcache.data.subsets import draw_version
from embedcache.data.versions import load_version
from embedcache.hashing import reverse_complement
from tests.mirrors import SHARED_DATA, write_split


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


def _containment(a, b, k=8):
    sa, sb = _kmers(a.upper(), k), _kmers(b.upper(), k)
    return len(sa & sb) / min(len(sa), len(sb)) if sa and sb else 0.0


def test_kmer_set_matrix_rows_are_the_distinct_kmers():
    seqs = ["ACGTACGTAC", "AAAAAAAA", "ACGNACGTACGTT", "AC", "acgtacgtac"]
    mat = kmer_set_matrix(seqs, k=3)
    alphabet = ["".join(p) for p in itertools.product("ACGT", repeat=3)]
    for i, seq in enumerate(seqs):
        cols = mat[i].indices
        assert {alphabet[c] for c in cols} == _kmers(seq.upper(), 3)
        assert len(cols) == len(set(cols.tolist()))  # a set: each k-mer once
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


def test_overlap_jaccard_and_containment_equal_pairwise_python():
    train = _random_seqs(12, 60, 10)
    test = _random_seqs(9, 60, 11)
    test[0] = train[3][10:50]  # a window inside a train sequence: contained, not near
    test[1] = train[4][:58] + "AC"
    test[2] = "NNNNNNN"  # no k-mer at all
    got = overlap(kmer_set_matrix(test), kmer_set_matrix(train))
    np.testing.assert_allclose(
        got.max_jaccard, [max(_jaccard(t, r) for r in train) for t in test]
    )
    np.testing.assert_allclose(
        got.max_containment, [max(_containment(t, r) for r in train) for t in test]
    )
    assert got.max_containment[0] == 1.0
    assert got.max_jaccard[0] == pytest.approx(33 / 53)
    want_near = [sum(_jaccard(t, r) >= 0.9 for r in train) for t in test]
    assert got.n_near.tolist() == want_near


def test_near_pairs_equal_brute_force_and_skip_the_diagonal():
    seqs = _random_seqs(15, 40, 12)
    seqs[5] = seqs[2][:39] + ("A" if seqs[2][39] != "A" else "C")
    seqs[9] = seqs[2]
    sets = kmer_set_matrix(seqs)
    q, r = near_pairs(sets, sets, skip_diagonal=True)
    got = sorted(zip(q.tolist(), r.tolist(), strict=True))
    want = sorted(
        (i, j)
        for i in range(15)
        for j in range(15)
        if i != j and _jaccard(seqs[i], seqs[j]) >= 0.9
    )
    assert got == want
    assert (2, 5) in got
    assert (2, 9) in got


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.text(alphabet="ACGTN", min_size=0, max_size=40), min_size=1, max_size=6)
)
def test_reverse_complement_sets_equal_sets_of_reverse_complements(seqs):
    mapped = reverse_complement_sets(kmer_set_matrix(seqs, k=3), k=3)
    direct = kmer_set_matrix([reverse_complement(s) for s in seqs], k=3)
    direct.sort_indices()
    assert (mapped != direct).nnz == 0


def test_containment_flags_a_window_that_jaccard_misses():
    train = _random_seqs(5, 200, 13)
    test = _random_seqs(4, 200, 14)
    test[0] = train[1][50:150]  # 93 of train[1]'s 193 8-mers: J 0.48, containment 1
    test[1] = reverse_complement(train[2][20:120])
    flags = audit_sequences(train, test)
    assert flags.near.tolist() == [False] * 4
    assert flags.containment.tolist() == [True, True, False, False]
    assert flags.clean.tolist() == [True] * 4
    assert flags.max_containment[0] == 1.0


def test_audit_datasets_keeps_item_order_and_counts_clean_items():
    train = _random_seqs(10, 100, 15)
    test = _random_seqs(5, 100, 16)
    test[3] = train[7][:99] + ("A" if train[7][99] != "A" else "C")  # near
    test[1] = train[2][30:90]  # contained only
    frame = pl.DataFrame(
        {
            "item_id": [f"a:train:{i:06d}" for i in range(10)]
            + [f"a:test:{i:06d}" for i in range(5)],
            "dataset": ["a"] * 15,
            "split": ["train"] * 10 + ["test"] * 5,
            "seq": [*train, *test],
        }
    )
    audits = audit_datasets(frame)
    assert audits["a"].item_ids == tuple(f"a:test:{i:06d}" for i in range(5))
    assert audits["a"].clean.tolist() == [True, True, True, False, True]
    row = audit_items(frame).row(0, named=True)
    assert (row["near_dup"], row["contained_dup"], row["n_clean"]) == (1, 2, 4)
    assert row["contained_share"] == pytest.approx(0.4)


def _write_version(tmp_path, dataset, *, n_test, n_train):
    path = tmp_path / "full.toml"
    path.write_text(
        f'name = "full"\nseed = 3\n[[datasets]]\nname = "{dataset}"\n'
        f"n_test = {n_test}\nn_train = {n_train}\n"
    )
    return path


def test_full_train_audit_counts_duplicates_the_draw_dropped(tmp_path):
    dataset = "human_enhancers_cohn"
    test = _random_seqs(6, 80, 17)
    train = _random_seqs(40, 80, 18)
    train[0] = test[0]  # exact: dropped before the draw, still in the full file
    train[1] = reverse_complement(test[1])
    train[2] = test[2][:79] + ("A" if test[2][79] != "A" else "C")  # near
    write_split(tmp_path, dataset, "test", test, [0, 1] * 3)
    write_split(tmp_path, dataset, "train", train, [i % 2 for i in range(40)])
    subset = draw_version(
        load_version(_write_version(tmp_path, dataset, n_test='"all"', n_train=10)),
        data_dir=tmp_path,
    )
    table = full_train_audit(subset)
    row = table.row(0, named=True)
    assert row["n_full_train"] == 40
    assert row["n_test"] == 6
    assert (row["exact_dup"], row["rc_dup"], row["near_dup"]) == (1, 1, 3)
    assert row["near_share"] == pytest.approx(0.5)
    assert row["source"].startswith("mirror")


def test_full_train_audit_of_the_demo_says_not_available():
    subset = draw_version(load_version("demo-v1"))
    table = full_train_audit(subset)
    assert table["dataset"].to_list() == list(subset.version.dataset_names)
    assert table["n_full_train"].null_count() == table.height


@pytest.mark.skipif(
    not (SHARED_DATA / "genomic-benchmarks").exists(),
    reason="needs ../shared/data (real Genomic Benchmarks test files)",
)
def test_real_sequences_overlap_matches_pairwise_python():
    raw = pl.read_csv(
        SHARED_DATA / "genomic-benchmarks" / "human_nontata_promoters" / "test.tsv",
        separator="\t",
    )
    seqs = raw["seq"].to_list()
    with_n = [s for s in seqs if "N" in s]
    test = seqs[:40] + with_n[:1]
    train = seqs[40:100]
    got = overlap(kmer_set_matrix(test), kmer_set_matrix(train))
    np.testing.assert_allclose(
        got.max_jaccard, [max(_jaccard(t, r) for r in train) for t in test]
    )
    np.testing.assert_allclose(
        got.max_containment, [max(_containment(t, r) for r in train) for t in test]
    )


def test_jaccard_of_exactly_the_threshold_is_near():
    a = "ACGTTGCAAGGCTTAGC"  # 17 bp: 10 distinct 8-mers
    b = a[:16]  # 9 of them: Jaccard 9 / 10
    assert len(_kmers(a, 8)) == 10
    assert _jaccard(a, b) == 0.9
    flags = audit_sequences([a], [b])
    assert flags.max_jaccard[0] == 0.9
    assert flags.near[0]
    assert not flags.exact[0]
