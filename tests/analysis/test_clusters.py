from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from embedcache.analysis.bootstrap import percentile_ci
from embedcache.analysis.clusters import (
    ClusterLabels,
    cluster_scores,
    cluster_test_items,
    near_duplicate_clusters,
    paired_to_best,
)
from embedcache.errors import AnalysisInputError
from embedcache.hashing import reverse_complement
from tests.evaluations import make_evaluation
from tests.mirrors import random_sequences


def _jaccard(a, b, k=8):
    sa = {a[i : i + k] for i in range(len(a) - k + 1)}
    sb = {b[i : i + k] for i in range(len(b) - k + 1)}
    return len(sa & sb) / len(sa | sb)


def _planted():
    """20 random 100 bp test sequences, then a planted chain A - B - C.

    B is A shifted by 4 bases (89 shared 8-mers of 97: J 0.918), C is B shifted by
    4 more (same), so A and C share 85 of 101 (J 0.84): one cluster only by single
    linkage. D is the reverse complement of E with its last base changed (J 0.979 on
    the other strand). F is an exact copy of G in lower case.
    """
    seqs = random_sequences(20, 100, seed=21)
    source = random_sequences(1, 108, seed=22)[0]
    seqs[2], seqs[9], seqs[15] = source[0:100], source[4:104], source[8:108]
    last = "A" if seqs[4][0] != "T" else "C"  # rc of the changed base differs
    seqs[11] = reverse_complement(seqs[4])[:99] + last
    seqs[17] = seqs[6].lower()
    return seqs


def test_planted_chain_rc_and_copy_give_exactly_the_expected_clusters():
    seqs = _planted()
    assert _jaccard(seqs[2], seqs[9]) >= 0.9
    assert _jaccard(seqs[2], seqs[15]) < 0.9  # only the chain links them
    labels = near_duplicate_clusters(seqs)
    # 20 items, 3 planted links inside {2, 9, 15}: -2 clusters; {4, 11}: -1; {6, 17}: -1
    assert labels.max() + 1 == 20 - 4
    assert labels[2] == labels[9] == labels[15]
    assert labels[4] == labels[11]
    assert labels[6] == labels[17]
    others = [i for i in range(20) if i not in {2, 9, 15, 4, 11, 6, 17}]
    assert len({int(labels[i]) for i in others}) == len(others)
    # labels are numbered by first appearance
    assert labels.tolist()[:3] == [0, 1, 2]
    assert sorted(set(labels.tolist())) == list(range(16))


def test_unplanted_random_items_are_singletons():
    labels = near_duplicate_clusters(random_sequences(50, 100, seed=23))
    assert labels.tolist() == list(range(50))


def test_short_identical_sequences_cluster_without_kmers():
    labels = near_duplicate_clusters(["ACG", "acg", "CGT", "TTT"])
    # "CGT" is the reverse complement of "ACG"; "TTT" stands alone
    assert labels.tolist() == [0, 0, 0, 1]


def test_cluster_test_items_per_dataset_in_item_order():
    seqs = _planted()
    items = pl.DataFrame(
        {
            "item_id": [f"a:test:{i:06d}" for i in range(20)]
            + ["b:test:000000", "b:train:000000"],
            "dataset": ["a"] * 20 + ["b", "b"],
            "split": ["test"] * 21 + ["train"],
            "seq": [*seqs, "ACGTACGTAC", "ACGTACGTAC"],
        }
    )
    got = cluster_test_items(items)
    assert got["a"].n_clusters == 16
    assert got["a"].largest == 3
    assert got["a"].item_ids == tuple(f"a:test:{i:06d}" for i in range(20))
    assert got["b"].n_clusters == 1  # train items are not clustered


def _dup_evaluation():
    # dataset "d": 40 items in 10 clusters of 4 identical copies; model "good" right
    # on 8 clusters, "bad" on 6.
    y = np.tile([0, 1], 20)
    good = y.copy()
    bad = y.copy()
    clusters = np.repeat(np.arange(10), 4)
    good[np.isin(clusters, [0, 1])] ^= 1
    bad[np.isin(clusters, [2, 3, 4, 5])] ^= 1
    evaluation = make_evaluation(
        {"d": y.tolist()},
        {"d": [good.tolist(), bad.tolist()]},
        ["good", "bad"],
        n_boot=400,
    )
    ids = tuple(evaluation.item_ids["d"])
    return evaluation, {"d": ClusterLabels("d", ids, clusters)}


def test_cluster_scores_count_clusters_and_widen_intervals():
    evaluation, clusters = _dup_evaluation()
    scored = cluster_scores(evaluation, clusters)
    assert scored.n_clusters == {"d": 10, "mean": 10}
    summary = scored.summary()
    row = summary.filter(
        (pl.col("model") == "good")
        & (pl.col("dataset") == "mean")
        & (pl.col("metric") == "accuracy")
    ).row(0, named=True)
    assert row["value"] == pytest.approx(0.8)
    assert row["n"] == 40
    assert row["n_clusters"] == 10
    # every resample draws whole clusters, so accuracy moves in steps of one cluster
    samples = scored.bootstrap.samples("accuracy")[:, 0]
    assert set(np.round(samples * 10, 9)) <= set(range(11))
    item_low, item_high = percentile_ci(evaluation.bootstrap.samples("accuracy")[:, 0])
    assert row["ci_high"] - row["ci_low"] > 1.5 * (item_high - item_low)


def test_paired_to_best_gives_item_and_cluster_intervals():
    evaluation, clusters = _dup_evaluation()
    table = paired_to_best(evaluation, cluster_scores(evaluation, clusters))
    assert table["reference"].unique().to_list() == ["good"]
    bad = table.filter(pl.col("model") == "bad").row(0, named=True)
    assert bad["difference"] == pytest.approx(-0.2)
    assert bad["cluster_ci_low"] < bad["ci_low"] <= -0.2 <= bad["ci_high"]
    good = table.filter(pl.col("model") == "good").row(0, named=True)
    assert (good["difference"], good["ci_low"], good["cluster_ci_high"]) == (0, 0, 0)


def test_misaligned_clusters_are_refused():
    evaluation, clusters = _dup_evaluation()
    wrong = {
        "d": ClusterLabels("d", clusters["d"].item_ids[::-1], clusters["d"].labels)
    }
    with pytest.raises(AnalysisInputError, match="other test items"):
        cluster_scores(evaluation, wrong)
