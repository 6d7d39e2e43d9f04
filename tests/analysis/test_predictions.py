"""Per-item predictions: the parquet's rows, pairwise agreement and kappa, items all get wrong."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from embedcache.analysis.leakage import audit_datasets
from embedcache.analysis.predictions import (
    PREDICTION_COLUMNS,
    agreement,
    always_wrong,
    cohen_kappa,
    predictions_frame,
    write_predictions,
)
from tests.evaluations import make_evaluation, tiny_board


def test_agreement_and_kappa_on_a_hand_made_case():
    # 8 items; a and b disagree on 2, c always says 1
    labels = {"d": [0, 0, 0, 0, 1, 1, 1, 1]}
    preds = {
        "d": [
            [0, 0, 0, 1, 1, 1, 1, 0],  # a
            [0, 0, 0, 0, 1, 1, 1, 1],  # b (the truth)
            [1, 1, 1, 1, 1, 1, 1, 1],  # c
        ]
    }
    ev = make_evaluation(labels, preds, ["a", "b", "c"])
    frame = agreement(ev, "d")
    rows = {(r["model_a"], r["model_b"]): r for r in frame.iter_rows(named=True)}
    assert set(rows) == {("a", "b"), ("a", "c"), ("b", "c")}
    ab = rows[("a", "b")]
    assert ab["n"] == 8
    assert ab["agreement"] == pytest.approx(6 / 8)
    # p_o = 0.75; both say 1 half the time: p_e = 0.5*0.5 + 0.5*0.5 = 0.5
    assert ab["kappa"] == pytest.approx((0.75 - 0.5) / 0.5)
    # c is constant: p_e equals p_o, kappa 0
    assert rows[("b", "c")]["agreement"] == pytest.approx(0.5)
    assert rows[("b", "c")]["kappa"] == pytest.approx(0.0)


def test_kappa_edge_cases():
    assert cohen_kappa([1, 0, 1], [1, 0, 1]) == pytest.approx(1.0)
    assert cohen_kappa([1, 0], [0, 1]) == pytest.approx(-1.0)
    assert math.isnan(cohen_kappa([1, 1], [1, 1]))  # no variation: undefined
    with pytest.raises(ValueError, match="one length"):
        cohen_kappa([1], [1, 0])


def test_always_wrong_counts_only_ranked_models():
    labels = {"d": [0, 1, 1, 0]}
    preds = {
        "d": [
            [1, 0, 1, 0],  # a: wrong on items 0, 1
            [1, 0, 0, 0],  # b: wrong on items 0, 1, 2
            [0, 1, 1, 0],  # floor: right everywhere, not counted
        ]
    }
    ev = make_evaluation(labels, preds, ["a", "b"], floors=("f",))
    wrong = always_wrong(ev, "d")
    assert wrong["item_id"].to_list() == ["d:test:000000", "d:test:000001"]
    assert wrong["label"].to_list() == [0, 1]


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    subset, _, ev = tiny_board(tmp_path_factory.mktemp("pred"), n_boot=50)
    return subset, ev, audit_datasets(subset.items)


def test_accuracy_from_predictions_equals_results(board, tmp_path):
    subset, ev, audits = board
    path = write_predictions(predictions_frame(ev, audits), tmp_path / "p.parquet")
    frame = pl.read_parquet(path)
    assert frame.columns == list(PREDICTION_COLUMNS)
    n_test = subset.items.filter(pl.col("split") == "test").height
    assert frame.height == len(ev.entries) * n_test
    assert frame.select(pl.struct("model", "item_id").is_unique().all()).item()
    got = frame.group_by("model", "dataset").agg(pl.col("correct").mean())
    want = ev.results.filter(
        (pl.col("metric") == "accuracy") & (pl.col("dataset") != "mean")
    )
    joined = want.join(got, on=["model", "dataset"])
    assert joined.height == want.height
    assert (joined["value"] == joined["correct"]).all()  # exactly, not approximately
    # the mean row: equal weight per dataset, as results.csv
    means = got.group_by("model").agg(pl.col("correct").mean())
    want_mean = ev.results.filter(
        (pl.col("metric") == "accuracy") & (pl.col("dataset") == "mean")
    ).join(means, on="model")
    assert np.allclose(want_mean["value"], want_mean["correct"], rtol=0, atol=1e-12)
    # predicted is the label p_label1 points to (ties aside), correct as stated
    probed = frame.filter(pl.col("model") != "majority")
    assert ((probed["p_label1"] > 0.5) == (probed["predicted"] == 1)).mean() > 0.99
    assert (frame["correct"] == (frame["label"] == frame["predicted"])).all()


def test_clean_flags_are_the_audits(board):
    _, ev, audits = board
    frame = predictions_frame(ev, audits)
    first = ev.entries[0].name
    for d, audit in audits.items():
        got = frame.filter((pl.col("model") == first) & (pl.col("dataset") == d))
        assert got["item_id"].to_list() == list(audit.item_ids)
        assert got["clean"].to_list() == list(np.asarray(audit.clean, dtype=bool))
