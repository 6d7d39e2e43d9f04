from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embedcache.analysis.bootstrap import (
    bootstrap_dataset,
    bootstrap_scores,
    percentile_ci,
)
from embedcache.analysis.paired import paired_differences, significance_ranks
from embedcache.analysis.probe import accuracy, macro_f1
from embedcache.analysis.resampling import dataset_rng, resample_counts
from embedcache.errors import ProbeError


def _preds(n, accs, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    preds = np.stack([np.where(rng.random(n) < a, y, 1 - y) for a in accs])
    return y, preds


def test_resample_counts_rows_sum_to_n_and_match_an_index_loop():
    n, n_boot = 37, 25
    blocks = list(resample_counts(n, n_boot, np.random.default_rng(4)))
    counts = np.concatenate(blocks)
    assert counts.shape == (n_boot, n)
    np.testing.assert_array_equal(counts.sum(axis=1), n)
    # Same generator stream drawn row by row in a loop gives the same counts.
    rng = np.random.default_rng(4)
    idx = rng.integers(0, n, size=(n_boot, n))
    loop = np.stack([np.bincount(row, minlength=n) for row in idx])
    np.testing.assert_array_equal(counts, loop)


def test_bootstrap_dataset_equals_a_naive_per_resample_loop():
    y, preds = _preds(300, [0.9, 0.7, 0.5], seed=1)
    got = bootstrap_dataset(y, preds, dataset="d", n_boot=200, seed=7)
    rng = dataset_rng(7, "d")
    # Rebuild the same resamples as explicit index lists and score them one by one.
    counts = np.concatenate(list(resample_counts(300, 200, rng)))
    for b in range(0, 200, 37):
        idx = np.repeat(np.arange(300), counts[b].astype(int))
        for m in range(3):
            assert got.boot_accuracy[b, m] == pytest.approx(
                accuracy(y[idx], preds[m, idx])
            )
            assert got.boot_macro_f1[b, m] == pytest.approx(
                macro_f1(y[idx], preds[m, idx])
            )
    for m in range(3):
        assert got.accuracy[m] == pytest.approx(accuracy(y, preds[m]))
        assert got.macro_f1[m] == pytest.approx(macro_f1(y, preds[m]))


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1)), min_size=1, max_size=40),
    st.integers(0, 2**16),
)
def test_point_scores_match_definitions(pairs, seed):
    y = np.array([a for a, _ in pairs])
    p = np.array([[b for _, b in pairs]])
    got = bootstrap_dataset(y, p, dataset="x", n_boot=5, seed=seed)
    assert got.accuracy[0] == pytest.approx(accuracy(y, p[0]))
    assert got.macro_f1[0] == pytest.approx(macro_f1(y, p[0]))
    assert np.all((got.boot_accuracy >= 0) & (got.boot_accuracy <= 1))


def test_ci_covers_truth_and_shrinks_with_n():
    y, preds = _preds(400, [0.8], seed=2)
    small = bootstrap_dataset(y[:100], preds[:, :100], dataset="a", n_boot=1000)
    big = bootstrap_dataset(y, preds, dataset="a", n_boot=1000)
    lo_s, hi_s = percentile_ci(small.boot_accuracy)
    lo_b, hi_b = percentile_ci(big.boot_accuracy)
    assert lo_b[0] < big.accuracy[0] < hi_b[0]
    assert (hi_b - lo_b)[0] < (hi_s - lo_s)[0]
    # Binomial standard error: the 95% width is about 4 * sqrt(p(1-p)/n).
    p = big.accuracy[0]
    assert (hi_b - lo_b)[0] == pytest.approx(3.92 * np.sqrt(p * (1 - p) / 400), rel=0.2)


def test_mean_averages_each_resample_over_datasets_with_equal_weight():
    ya, pa = _preds(50, [0.9, 0.6], seed=3)
    yb, pb = _preds(500, [0.5, 0.8], seed=4)
    res = bootstrap_scores(
        {"a": ya, "b": yb}, {"a": pa, "b": pb}, ["m1", "m2"], n_boot=100
    )
    np.testing.assert_allclose(
        res.point("accuracy"),
        (res.point("accuracy", "a") + res.point("accuracy", "b")) / 2,
    )
    np.testing.assert_allclose(
        res.samples("macro_f1"),
        (res.samples("macro_f1", "a") + res.samples("macro_f1", "b")) / 2,
    )
    assert res.n() == 550
    table = res.summary()
    assert table.height == 2 * 3 * 2  # models x (datasets + mean) x metrics
    row = table.filter(
        (table["model"] == "m1")
        & (table["dataset"] == "mean")
        & (table["metric"] == "accuracy")
    )
    assert row["ci_low"][0] <= row["value"][0] <= row["ci_high"][0]


def test_resamples_do_not_depend_on_other_models_or_datasets():
    y, preds = _preds(200, [0.7, 0.8, 0.9], seed=5)
    alone = bootstrap_scores({"d": y}, {"d": preds[:1]}, ["m"], n_boot=50, seed=9)
    yo, po = _preds(30, [0.5, 0.5, 0.5], seed=6)
    crowd = bootstrap_scores(
        {"other": yo, "d": y},
        {"other": po, "d": preds},
        ["m", "x", "z"],
        n_boot=50,
        seed=9,
    )
    np.testing.assert_array_equal(
        alone.samples("accuracy", "d")[:, 0], crowd.samples("accuracy", "d")[:, 0]
    )
    other_seed = bootstrap_scores({"d": y}, {"d": preds[:1]}, ["m"], n_boot=50, seed=10)
    assert not np.array_equal(
        alone.samples("accuracy", "d"), other_seed.samples("accuracy", "d")
    )


def test_paired_difference_is_tighter_than_unpaired_and_flags_ties():
    rng = np.random.default_rng(8)
    n = 400
    y = rng.integers(0, 2, n)
    base = np.where(rng.random(n) < 0.8, y, 1 - y)
    near = base.copy()
    # differs from base on 6 items: 3 right -> wrong, 3 wrong -> right (same accuracy)
    right, wrong = np.flatnonzero(base == y), np.flatnonzero(base != y)
    flip = np.concatenate([right[:3], wrong[:3]])
    near[flip] = 1 - near[flip]
    far = np.where(rng.random(n) < 0.6, y, 1 - y)
    res = bootstrap_scores(
        {"d": y}, {"d": np.stack([base, near, far])}, ["base", "near", "far"]
    )
    diff = paired_differences(res, dataset="d")
    assert diff["reference"][0] == (
        "base" if accuracy(y, base) >= accuracy(y, near) else "near"
    )
    flags = dict(zip(diff["model"], diff["indistinguishable"], strict=True))
    assert flags["near"]
    assert flags["base"]
    assert not flags["far"]
    row = diff.filter(diff["model"] == "near")
    lo, hi = percentile_ci(res.samples("accuracy", "d"))
    paired_width = row["ci_high"][0] - row["ci_low"][0]
    assert paired_width < 0.5 * min(hi - lo)


def test_significance_ranks_share_ties():
    rng = np.random.default_rng(0)
    b = 1000
    a = rng.normal(0.9, 0.01, b)
    samples = np.stack(
        [a, a - 0.001 + rng.normal(0, 0.002, b), a - 0.2, a - 0.2], axis=1
    )
    ranks = significance_ranks(samples)
    assert ranks.tolist() == [1, 1, 3, 3]


def test_bad_inputs_raise():
    with pytest.raises(ProbeError, match="shape"):
        bootstrap_dataset(np.zeros(5), np.zeros((2, 4)), dataset="d")
    with pytest.raises(ProbeError, match="0 or 1"):
        bootstrap_dataset(np.array([0, 2]), np.zeros((1, 2)), dataset="d")
    with pytest.raises(ProbeError, match="cover"):
        bootstrap_scores({"a": np.zeros(2)}, {"b": np.zeros((1, 2))}, ["m"])


def test_cluster_bootstrap_equals_a_naive_loop_over_drawn_clusters():
    from embedcache.analysis.bootstrap import cluster_bootstrap_dataset

    y, preds = _preds(60, [0.9, 0.6], seed=5)
    clusters = np.repeat(np.arange(20), 3)[np.random.default_rng(1).permutation(60)]
    clusters[clusters == 4] = 3  # one cluster of six, one label (4) unused
    got = cluster_bootstrap_dataset(y, preds, clusters, dataset="c", n_boot=50, seed=2)
    # Rebuild the resamples: labels are compacted to 0..18 in sorted order.
    units = np.unique(clusters, return_inverse=True)[1]
    counts = np.concatenate(list(resample_counts(19, 50, dataset_rng(2, "c#clusters"))))
    for b in range(0, 50, 7):
        idx = np.concatenate(
            [np.flatnonzero(units == u).repeat(int(c)) for u, c in enumerate(counts[b])]
        )
        for m in range(2):
            assert got.boot_accuracy[b, m] == pytest.approx(
                accuracy(y[idx], preds[m, idx])
            )
            assert got.boot_macro_f1[b, m] == pytest.approx(
                macro_f1(y[idx], preds[m, idx])
            )
    assert got.accuracy[0] == pytest.approx(accuracy(y, preds[0]))


def test_singleton_clusters_make_cluster_and_item_bootstrap_alike():
    from embedcache.analysis.bootstrap import cluster_bootstrap_dataset

    y, preds = _preds(500, [0.8], seed=6)
    items = bootstrap_dataset(y, preds, dataset="s", n_boot=1000, seed=0)
    singles = cluster_bootstrap_dataset(
        y, preds, np.arange(500), dataset="s", n_boot=1000, seed=0
    )
    lo_i, hi_i = percentile_ci(items.boot_accuracy)
    lo_c, hi_c = percentile_ci(singles.boot_accuracy)
    assert abs((hi_i - lo_i)[0] - (hi_c - lo_c)[0]) < 0.01


def test_clustered_duplicates_widen_the_interval():
    from embedcache.analysis.bootstrap import cluster_bootstrap_dataset

    # 100 distinct items, each repeated 5 times: 500 items but only 100 independent.
    y, preds = _preds(100, [0.75], seed=7)
    y5, p5 = np.repeat(y, 5), np.repeat(preds, 5, axis=1)
    clusters = np.repeat(np.arange(100), 5)
    items = bootstrap_dataset(y5, p5, dataset="w", n_boot=1000, seed=0)
    clustered = cluster_bootstrap_dataset(
        y5, p5, clusters, dataset="w", n_boot=1000, seed=0
    )
    width_items = np.diff(percentile_ci(items.boot_accuracy), axis=0)[0, 0]
    width_clusters = np.diff(percentile_ci(clustered.boot_accuracy), axis=0)[0, 0]
    assert width_clusters > 1.8 * width_items  # about sqrt(5) = 2.2 wider


def test_subset_gap_equals_a_naive_loop():
    from embedcache.analysis.paired import subset_gap

    y, preds = _preds(80, [0.9, 0.5], seed=8)
    mask = np.random.default_rng(3).random(80) < 0.6
    gap = subset_gap({"g": y}, {"g": preds}, {"g": mask}, ["a", "b"], n_boot=40, seed=4)
    for m in range(2):
        want = accuracy(y, preds[m]) - accuracy(y[mask], preds[m, mask])
        assert gap.point["g"][m] == pytest.approx(want)
        assert gap.point["mean"][m] == pytest.approx(want)
    counts = np.concatenate(list(resample_counts(80, 40, dataset_rng(4, "g"))))
    for b in range(0, 40, 9):
        idx = np.repeat(np.arange(80), counts[b].astype(int))
        sub = idx[mask[idx]]
        for m in range(2):
            want = accuracy(y[idx], preds[m, idx]) - accuracy(y[sub], preds[m, sub])
            assert gap.samples["g"][b, m] == pytest.approx(want)
    frame = gap.frame()
    assert frame.columns == [
        "model",
        "dataset",
        "difference",
        "ci_low",
        "ci_high",
        "excludes_zero",
    ]
    assert frame.height == 4


def test_subset_gap_without_subset_items_is_nan():
    from embedcache.analysis.paired import subset_gap

    y, preds = _preds(30, [0.8], seed=9)
    gap = subset_gap(
        {"a": y, "b": y},
        {"a": preds, "b": preds},
        {"a": np.zeros(30, bool), "b": np.ones(30, bool)},
        ["m"],
        n_boot=20,
    )
    assert np.isnan(gap.point["a"]).all()
    assert np.isnan(gap.point["mean"]).all()
    assert gap.point["b"][0] == 0.0
