from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import f1_score, log_loss
from sklearn.model_selection import GridSearchCV, StratifiedKFold
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

from embedcache.analysis.probe import (
    ProbeConfig,
    accuracy,
    binary_log_loss,
    cv_log_loss,
    fit_probe,
    macro_f1,
    majority_label,
)
from embedcache.errors import ProbeError


def _data(n=200, dim=12, seed=0, signal=1.5):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    X = rng.normal(size=(n, dim))
    X[:, 0] += signal * (2 * y - 1)
    X[:, 1] *= 50.0  # a badly scaled column: the scaler must matter
    return X, y


def test_cv_log_loss_matches_cold_start_pipeline_per_fold():
    X, y = _data()
    config = ProbeConfig(c_grid=(1e-3, 1e-1, 10.0), n_folds=5, cv_seed=3)
    got = cv_log_loss(X, y, config=config)
    folds = StratifiedKFold(5, shuffle=True, random_state=3)
    for j, c in enumerate(config.c_grid):
        losses = []
        for tr, va in folds.split(X, y):
            pipe = Pipeline([("s", StandardScaler()), ("l", LogisticRegression(C=c))])
            pipe.fit(X[tr], y[tr])
            losses.append(log_loss(y[va], pipe.predict_proba(X[va]), labels=[0, 1]))
        assert got[j] == pytest.approx(
            np.mean(losses), rel=1e-3
        )  # lbfgs tol: warm and cold starts stop a hair apart


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_binary_log_loss_equals_sklearn_exactly(seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 37)
    p1 = rng.random(37)
    p1[:3] = [0.0, 1.0, 1e-300]  # clipped at eps like sklearn does
    proba = np.stack([1 - p1, p1], axis=1)
    assert binary_log_loss(y, proba) == log_loss(y, proba, labels=[0, 1])


def test_fit_probe_picks_the_same_c_as_gridsearch():
    X, y = _data(seed=1)
    config = ProbeConfig(c_grid=(1e-4, 1e-2, 1.0, 100.0), cv_seed=0)
    fit = fit_probe(X, y, config=config)
    pipe = Pipeline([("s", StandardScaler()), ("l", LogisticRegression(max_iter=2000))])
    search = GridSearchCV(
        pipe,
        {"l__C": list(config.c_grid)},
        scoring="neg_log_loss",
        cv=StratifiedKFold(5, shuffle=True, random_state=0),
    ).fit(X, y)
    assert search.best_params_["l__C"] == fit.C_
    assert fit.cv_log_loss_ == pytest.approx(
        -search.cv_results_["mean_test_score"], rel=1e-3
    )  # lbfgs tol: warm and cold starts stop a hair apart
    np.testing.assert_array_equal(fit.predict(X), search.predict(X))


def test_probe_learns_signal_and_is_deterministic():
    X, y = _data(n=400, seed=2, signal=2.0)
    fit_a = fit_probe(X[:300], y[:300])
    fit_b = fit_probe(X[:300], y[:300])
    pred = fit_a.predict(X[300:])
    assert accuracy(y[300:], pred) > 0.85
    np.testing.assert_array_equal(pred, fit_b.predict(X[300:]))
    assert fit_a.C_ == fit_b.C_
    assert fit_a.predict_proba(X[300:]).shape == (100,)


def test_probe_rejects_nan_vectors_and_too_few_of_a_label():
    X, y = _data(n=60)
    X_nan = X.copy()
    X_nan[3, 2] = np.nan
    with pytest.raises(ProbeError, match="NaN"):
        fit_probe(X_nan, y)
    y_few = np.zeros(60, dtype=int)
    y_few[:3] = 1
    with pytest.raises(ProbeError, match="at least 5 of each label"):
        fit_probe(X, y_few)
    with pytest.raises(ProbeError, match="0 or 1"):
        fit_probe(X, y + 1)


def test_majority_label_ties_go_to_zero():
    assert majority_label([1, 1, 0]) == 1
    assert majority_label([0, 1, 1, 0]) == 0
    with pytest.raises(ProbeError):
        majority_label([])


@pytest.mark.parametrize("seed", range(5))
def test_macro_f1_matches_sklearn(seed):
    rng = np.random.default_rng(seed)
    t = rng.integers(0, 2, 50)
    p = rng.integers(0, 2, 50) if seed else np.ones(50, dtype=int)
    want = f1_score(t, p, average="macro", labels=[0, 1], zero_division=0.0)
    assert macro_f1(t, p) == pytest.approx(want)


def test_default_grid_is_the_protocols_seventeen_half_decades():
    config = ProbeConfig()
    assert len(config.c_grid) == 17
    np.testing.assert_allclose(config.c_grid, np.logspace(-4, 4, 17), rtol=0)
    assert config.c_grid[0] == pytest.approx(1e-4)
    assert config.c_grid[-1] == pytest.approx(1e4)
    assert config.c_grid[1] == pytest.approx(10**-3.5)
    # recorded with every result
    assert config.to_dict()["c_grid"] == list(config.c_grid)


def test_ties_in_log_loss_go_to_the_smaller_c(monkeypatch):
    import embedcache.analysis.probe as probe_mod

    X, y = _data(seed=4)
    grid = (10.0, 1e-2, 1.0, 1e-3)
    # every C scores the same except the largest: the smallest C must win
    monkeypatch.setattr(
        probe_mod,
        "cv_log_loss",
        lambda X, y, config: np.array([0.5, 0.6, 0.6, 0.6]),
    )
    assert fit_probe(X, y, config=ProbeConfig(c_grid=grid)).C_ == 10.0
    monkeypatch.setattr(
        probe_mod,
        "cv_log_loss",
        lambda X, y, config: np.array([0.6, 0.6, 0.6, 0.6]),
    )
    assert fit_probe(X, y, config=ProbeConfig(c_grid=grid)).C_ == 1e-3
