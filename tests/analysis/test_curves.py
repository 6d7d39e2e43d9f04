from __future__ import annotations

import hashlib

import numpy as np
import polars as pl
import pytest

from embedcache.analysis.curves import (
    CURVE_COLUMNS,
    curve_probe_config,
    label_efficiency,
    nested_train_subsets,
    write_curves,
)
from embedcache.analysis.probe import ProbeConfig
from embedcache.errors import AnalysisInputError
from tests.evaluations import tiny_board


def _rank(seed, item_id):
    return hashlib.sha256(f"{seed}:{item_id}".encode()).hexdigest()


def test_nested_subsets_are_prefixes_of_each_label_in_seed_hash_order():
    ids = [f"d:train:{i:06d}" for i in range(60)]
    labels = [int(i % 5 < 2) for i in range(60)]  # 36 of label 0, 24 of label 1
    pool = pl.DataFrame({"item_id": ids, "label": labels})
    subsets = nested_train_subsets(pool, [10, 20, 50, 100], seed=11)
    assert list(subsets) == [10, 20, 50]  # 100 > pool: skipped
    order = {
        lab: sorted(
            (i for i, y in zip(ids, labels, strict=True) if y == lab),
            key=lambda item: _rank(11, item),
        )
        for lab in (0, 1)
    }
    # largest remainder: 10 -> 6/4, 20 -> 12/8, 50 -> 30/20
    for n, (q0, q1) in {10: (6, 4), 20: (12, 8), 50: (30, 20)}.items():
        got = subsets[n]
        assert got["item_id"].to_list() == sorted(order[0][:q0] + order[1][:q1])
    assert set(subsets[10]["item_id"]) < set(subsets[20]["item_id"])
    assert set(subsets[20]["item_id"]) < set(subsets[50]["item_id"])


@pytest.mark.parametrize(
    ("counts", "folds"),
    [((5, 5), 5), ((40, 60), 5), ((3, 7), 3), ((2, 8), 2), ((1, 9), None)],
)
def test_fold_count_follows_the_rarest_label(counts, folds):
    y = np.array([0] * counts[0] + [1] * counts[1])
    cfg = curve_probe_config(y, ProbeConfig())
    if folds is None:
        assert cfg is None
    else:
        assert cfg.n_folds == folds
        assert cfg.c_grid == ProbeConfig().c_grid


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_board(tmp_path_factory.mktemp("versions"), n_boot=200, seed=1)


def test_curves_frame_columns_points_and_full_size_matches_the_board(tiny, tmp_path):
    subset, store, evaluation = tiny
    curves = label_efficiency(
        subset, store, evaluation.entries, sizes=(10, 20, 50, 80), n_boot=200, seed=1
    )
    frame = curves.frame
    assert frame.columns == list(CURVE_COLUMNS)
    assert set(frame["metric"]) == {"accuracy"}
    assert sorted(set(frame["n_train"])) == [10, 20, 50, 80]
    n_entries = len(evaluation.entries)
    assert frame.height == n_entries * 4 * 3  # entries x sizes x (2 datasets + mean)
    # n_train = the whole train (80 here) is the leaderboard's probe exactly
    full = frame.filter(pl.col("n_train") == 80).drop("n_train")
    board = evaluation.results.filter(pl.col("metric") == "accuracy")
    joined = full.join(board, on=["model", "dataset"], suffix="_board")
    assert joined.height == n_entries * 3
    np.testing.assert_allclose(joined["value"], joined["value_board"])
    np.testing.assert_allclose(joined["ci_low"], joined["ci_low_board"])
    assert (joined["n"] == joined["n_board"]).all()
    # the mean row is the mean of the datasets
    strong = frame.filter((pl.col("model") == "toy/strong") & (pl.col("n_train") == 20))
    values = dict(zip(strong["dataset"], strong["value"], strict=True))
    assert values["mean"] == pytest.approx(
        (values["human_enhancers_cohn"] + values["human_nontata_promoters"]) / 2
    )
    # more labels help the strong model on average
    mean = frame.filter(
        (pl.col("model") == "toy/strong") & (pl.col("dataset") == "mean")
    )
    assert mean.sort("n_train")["value"][-1] > mean.sort("n_train")["value"][0]
    fits = curves.fits
    assert set(fits["n_folds"]) == {5}  # 5 or more of each label at n_train = 10
    small = fits.filter(pl.col("n_train") == 10)
    assert (small["n_label_0"] + small["n_label_1"] == 10).all()
    # reusing the board's predictions at the full size gives the same curves
    reused = label_efficiency(
        subset,
        store,
        evaluation.entries,
        sizes=(10, 80),
        n_boot=200,
        seed=1,
        board=evaluation,
    )
    assert reused.frame.equals(frame.filter(pl.col("n_train").is_in([10, 80])))
    key = ["model", "dataset", "n_train"]
    assert reused.fits.sort(key).equals(
        curves.fits.filter(pl.col("n_train").is_in([10, 80])).sort(key)
    )
    path = write_curves(frame, tmp_path / "out" / "curves.csv")
    back = pl.read_csv(path)
    assert back.columns == list(CURVE_COLUMNS)
    assert back.height == frame.height


def test_board_of_another_probe_config_is_refused(tiny):
    subset, store, evaluation = tiny
    other = ProbeConfig(c_grid=(1.0,))
    with pytest.raises(AnalysisInputError, match="same subset and probe config"):
        label_efficiency(
            subset, store, evaluation.entries, probe_config=other, board=evaluation
        )
