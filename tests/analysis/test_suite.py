from __future__ import annotations

import polars as pl
import pytest

from embedcache.analysis.results import RESULT_COLUMNS
from embedcache.analysis.suite import run_analyses
from embedcache.report import analysis_tables as at
from tests.evaluations import tiny_board


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    subset, store, evaluation = tiny_board(
        tmp_path_factory.mktemp("versions"), n_boot=100, seed=1
    )
    analyses = run_analyses(subset, store, evaluation, curve_sizes=(10, 80))
    return evaluation, analyses


def test_results_gain_clean_and_cluster_rows_with_the_same_columns(done):
    evaluation, analyses = done
    results = analyses.results(evaluation)
    assert results.columns == list(RESULT_COLUMNS)
    per_metric = dict(results.group_by("metric").len().iter_rows())
    n_rows = len(evaluation.entries) * 3  # 2 datasets + mean
    assert per_metric == {
        "accuracy": n_rows,
        "macro_f1": n_rows,
        "accuracy_clean": n_rows,
        "accuracy_cluster_ci": n_rows,
    }
    # the cluster rows repeat the board's accuracy, with n = number of clusters
    acc = results.filter(pl.col("metric") == "accuracy").sort("model", "dataset")
    clu = results.filter(pl.col("metric") == "accuracy_cluster_ci").sort(
        "model", "dataset"
    )
    assert acc["value"].to_list() == clu["value"].to_list()
    counts = analyses.clustered.n_clusters
    assert set(clu["n"].to_list()) == set(counts.values())
    clean = results.filter(pl.col("metric") == "accuracy_clean")
    assert set(clean["n"].to_list()) == set(analyses.clean.n_clean.values())
    assert set(analyses.seconds) >= {"leakage audit", "label-efficiency curves"}


def test_every_table_and_figure_renders(done):
    evaluation, analyses = done
    tables = [
        at.clean_table(evaluation, analyses),
        at.clean_dataset_table(evaluation, analyses),
        at.leakage_audit_table(analyses),
        at.full_train_table(analyses),
        at.cluster_table(evaluation, analyses),
        at.cluster_paired_table(evaluation, analyses),
        at.curves_table(evaluation, analyses),
        at.timings_table(analyses),
        at.pretraining_table(evaluation, analyses),
        at.layers_table(evaluation, analyses),
    ]
    for table in tables:
        html = table.to_html()
        assert "<table" in html
    assert "not comparable to the leaderboard" in tables[0].caption
    assert "contained (reported only)" in tables[2].to_html()
    assert "not available here" in tables[3].to_html()  # the demo data has no train
    assert "n_train=80" in tables[6].to_html()
    assert "no random-init twin" in tables[8].to_html()
    assert "no model with several stored layers" in tables[9].to_html()
    png = at.curves_figure(evaluation, analyses).to_png()
    assert png.startswith(b"\x89PNG")
