from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from embedcache.analysis.bootstrap import bootstrap_dataset, percentile_ci
from embedcache.analysis.clean import clean_rank_changes, clean_scores
from embedcache.analysis.clusters import ClusterLabels
from embedcache.analysis.leakage import DatasetAudit, LeakageFlags
from embedcache.analysis.results import RESULT_COLUMNS
from embedcache.errors import AnalysisInputError
from tests.evaluations import make_evaluation


def _audit(dataset, item_ids, clean):
    near = ~np.asarray(clean, dtype=bool)
    zeros = np.zeros(near.size)
    flags = LeakageFlags(near & False, near & False, near, zeros, near, zeros)
    return DatasetAudit(dataset, tuple(item_ids), 500, flags)


def _memoriser():
    """Dataset a: 100 clean + 100 leaked items; b: 50 items, all clean.

    memo is right on every leaked item and on 50 clean ones (a: 0.75 overall, 0.5
    clean); general on 90 clean and 30 leaked (a: 0.6 overall, 0.9 clean). On b both
    are right on the first 40 (0.8).
    """
    y_a = np.tile([0, 1], 100)
    clean_a = np.arange(200) < 100
    memo = np.where(clean_a & (np.arange(200) >= 50), 1 - y_a, y_a)
    general = np.where(
        (clean_a & (np.arange(200) >= 90)) | (~clean_a & (np.arange(200) >= 130)),
        1 - y_a,
        y_a,
    )
    y_b = np.tile([0, 1], 25)
    right_b = np.where(np.arange(50) < 40, y_b, 1 - y_b)
    evaluation = make_evaluation(
        {"a": y_a.tolist(), "b": y_b.tolist()},
        {"a": [memo.tolist(), general.tolist()], "b": [right_b.tolist()] * 2},
        ["memo", "general"],
        n_boot=500,
    )
    audits = {
        "a": _audit("a", evaluation.item_ids["a"], clean_a),
        "b": _audit("b", evaluation.item_ids["b"], np.ones(50, bool)),
    }
    return evaluation, audits


def test_clean_accuracy_n_and_mean_by_hand():
    evaluation, audits = _memoriser()
    clean = clean_scores(evaluation, audits)
    assert clean.n_clean == {"a": 100, "b": 50, "mean": 150}
    np.testing.assert_allclose(clean.point("a"), [0.5, 0.9])
    np.testing.assert_allclose(clean.point("b"), [0.8, 0.8])
    np.testing.assert_allclose(clean.point(), [0.65, 0.85])
    summary = clean.summary()
    assert set(summary["metric"]) == {"accuracy_clean"}
    mean_memo = summary.filter(
        (pl.col("model") == "memo") & (pl.col("dataset") == "mean")
    ).row(0, named=True)
    assert mean_memo["n"] == 150
    assert mean_memo["ci_low"] < 0.65 < mean_memo["ci_high"]
    # the CI of a dataset is the protocol's bootstrap over its clean items
    mask = np.arange(200) < 100
    direct = bootstrap_dataset(
        evaluation.labels["a"][mask],
        evaluation.predictions["a"][:, mask],
        dataset="a",
        n_boot=500,
        seed=0,
    )
    low, high = percentile_ci(direct.boot_accuracy)
    row_a = summary.filter(
        (pl.col("model") == "general") & (pl.col("dataset") == "a")
    ).row(0, named=True)
    assert (row_a["ci_low"], row_a["ci_high"]) == (low[1], high[1])


def test_gap_is_accuracy_minus_clean_accuracy_with_paired_ci():
    evaluation, audits = _memoriser()
    gap = clean_scores(evaluation, audits).gap.frame()
    memo = gap.filter((pl.col("model") == "memo") & (pl.col("dataset") == "mean"))
    general = gap.filter((pl.col("model") == "general") & (pl.col("dataset") == "mean"))
    assert memo["difference"][0] == pytest.approx((0.25 + 0.0) / 2)
    assert general["difference"][0] == pytest.approx((-0.3 + 0.0) / 2)
    assert memo["excludes_zero"][0]
    assert memo["ci_low"][0] > 0
    assert general["ci_high"][0] < 0
    b = gap.filter(pl.col("dataset") == "b")
    assert b["difference"].to_list() == [0.0, 0.0]
    assert b["ci_low"].to_list() == [
        0.0,
        0.0,
    ]  # all items clean: no gap in any resample


def test_rank_change_is_flagged():
    evaluation, audits = _memoriser()
    changes = clean_rank_changes(evaluation, clean_scores(evaluation, audits))
    row = {r["model"]: r for r in changes.iter_rows(named=True)}
    assert (row["memo"]["rank"], row["memo"]["rank_clean"]) == (1, 2)
    assert (row["general"]["rank"], row["general"]["rank_clean"]) == (2, 1)
    assert row["memo"]["rank_changed"]
    assert row["general"]["position_clean"] == 1


def test_results_rows_have_the_results_columns():
    evaluation, audits = _memoriser()
    rows = evaluation.analysis_results(clean_scores(evaluation, audits).summary())
    assert rows.columns == list(RESULT_COLUMNS)
    assert rows.height == 2 * 3
    assert rows["dataset"].to_list() == ["a", "b", "mean"] * 2
    assert rows["model_key"].to_list()[0] == evaluation.entries[0].model_key


def test_cluster_gap_uses_cluster_resamples():
    evaluation, audits = _memoriser()
    labels = {
        "a": np.repeat(np.arange(20), 10),  # 10 items a cluster, clean or not alike
        "b": np.arange(50),
    }
    clusters = {
        d: ClusterLabels(d, tuple(evaluation.item_ids[d]), labels[d]) for d in labels
    }
    clean = clean_scores(evaluation, audits, clusters=clusters)
    items = clean.gap.frame().filter(pl.col("dataset") == "a")
    clustered = clean.gap_clustered.frame().filter(pl.col("dataset") == "a")
    assert items["difference"].to_list() == clustered["difference"].to_list()
    width = (items["ci_high"] - items["ci_low"]).to_numpy()
    width_c = (clustered["ci_high"] - clustered["ci_low"]).to_numpy()
    assert (width_c > width).all()


def test_dataset_without_clean_items_gives_nan_not_a_crash():
    evaluation, audits = _memoriser()
    audits["b"] = _audit("b", evaluation.item_ids["b"], np.zeros(50, bool))
    clean = clean_scores(evaluation, audits)
    assert clean.n_clean["b"] == 0
    assert np.isnan(clean.point("b")).all()
    assert np.isnan(clean.point()).all()
    np.testing.assert_allclose(clean.point("a"), [0.5, 0.9])
    summary = clean.summary()
    assert summary.filter(pl.col("dataset") == "mean")["value"].is_nan().all()
    changes = clean_rank_changes(evaluation, clean)
    assert changes["rank_clean"].null_count() == 2
    assert not changes["rank_changed"].any()


def test_audit_of_other_items_is_refused():
    evaluation, audits = _memoriser()
    audits["a"] = _audit("a", evaluation.item_ids["a"][:-1], np.ones(199, bool))
    with pytest.raises(AnalysisInputError, match="leakage audit of a"):
        clean_scores(evaluation, audits)
