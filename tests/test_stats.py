from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embedcache.errors import ProbeError
from embedcache.probe import accuracy, macro_f1
from embedcache.stats import (
    bootstrap_dataset,
    bootstrap_scores,
    dataset_rng,
    paired_differences,
    percentile_ci,
    resample_counts,
    significance_ranks,
)


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
