"""Bootstrap confidence intervals of every model's scores, item and cluster resampling.

Resampling (PROTOCOL.md, "Uncertainty"): each of ``n_boot`` resamples draws the test
items of every dataset with replacement, within that dataset. A resample is held as
counts (how often each item was drawn), so every model's score on every resample is
one matrix product of the counts with the models' 0/1 vectors; macro F1 comes from
the per-resample confusion counts. No probe is refit and there is no Python loop per
resample. All models see the same resamples, which is what makes differences paired.

Cluster resampling (a second interval beside the protocol's, never the headline):
near-duplicate test items are not independent, so :func:`cluster_bootstrap_scores`
resamples whole clusters of items (with replacement, within each dataset) and scores
the items they hold; a resample's item count then varies. Cluster sums of the same
columns make this one matrix product too.

Paired differences and ranks on these resamples: :mod:`embedcache.analysis.paired`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from embedcache.analysis.resampling import dataset_rng, unit_sums
from embedcache.errors import ProbeError

if TYPE_CHECKING:
    from numpy.typing import ArrayLike, NDArray

logger = logging.getLogger(__name__)

METRICS = ("accuracy", "macro_f1")
MEAN = "mean"
N_BOOT = 1000
LEVEL = 0.95


def _f1_pair(
    tp: NDArray[np.float64], fp: NDArray[np.float64], fn: NDArray[np.float64]
) -> NDArray[np.float64]:
    denom = 2 * tp + fp + fn
    return np.divide(2 * tp, denom, out=np.zeros_like(denom), where=denom > 0)


def _scores_from_confusion(
    n: float | NDArray[np.float64],
    pos: NDArray[np.float64],
    pred_pos: NDArray[np.float64],
    tp: NDArray[np.float64],
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Accuracy and macro F1 from counts; n and pos broadcast against pred_pos and tp."""
    fp = pred_pos - tp
    fn = pos - tp
    tn = n - pos - fp
    acc = (tp + tn) / n
    f1 = (_f1_pair(tp, fp, fn) + _f1_pair(tn, fn, fp)) / 2
    return acc, f1


@dataclass(frozen=True)
class DatasetScores:
    """Point scores and bootstrap resamples of M models on one dataset."""

    dataset: str
    n: int
    accuracy: NDArray[np.float64]  # (M,)
    macro_f1: NDArray[np.float64]  # (M,)
    boot_accuracy: NDArray[np.float64]  # (n_boot, M)
    boot_macro_f1: NDArray[np.float64]  # (n_boot, M)


def check_predictions(
    y_true: ArrayLike, preds: ArrayLike, dataset: str
) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
    y = np.asarray(y_true)
    p = np.atleast_2d(np.asarray(preds))
    if y.ndim != 1 or p.ndim != 2 or p.shape[1] != y.shape[0]:
        msg = (
            f"{dataset}: predictions have shape {p.shape} and labels {y.shape}; "
            "expected (n_models, n) and (n,)"
        )
        raise ProbeError(msg)
    if y.size == 0:
        msg = f"{dataset}: no test items to score"
        raise ProbeError(msg)
    if not (np.isin(y, (0, 1)).all() and np.isin(p, (0, 1)).all()):
        msg = f"{dataset}: labels and predictions must be 0 or 1"
        raise ProbeError(msg)
    return y.astype(np.float32), p.astype(np.float32)


def bootstrap_dataset(
    y_true: ArrayLike,
    preds: ArrayLike,
    *,
    dataset: str,
    n_boot: int = N_BOOT,
    seed: int = 0,
) -> DatasetScores:
    """Point scores and ``n_boot`` resampled scores of each model on one dataset.

    Parameters
    ----------
    y_true
        (n,) true labels, 0/1.
    preds
        (M, n) predicted labels of M models on the same items.
    dataset
        Name; with ``seed`` it fixes the resamples.
    """
    y, p = check_predictions(y_true, preds, dataset)
    n = y.shape[0]
    # Columns: [y, pred_1..M, y*pred_1..M] -> positives, predicted positives, tp.
    cols = np.concatenate([y[None, :], p, p * y[None, :]], axis=0).T
    n_models = p.shape[0]
    boot = unit_sums(cols, n_boot=n_boot, rng=dataset_rng(seed, dataset))
    point = cols.sum(axis=0, dtype=np.float64)

    def split(c: NDArray[np.float64]) -> tuple[NDArray[np.float64], ...]:
        return c[..., :1], c[..., 1 : 1 + n_models], c[..., 1 + n_models :]

    acc, f1 = _scores_from_confusion(float(n), *split(point))
    b_acc, b_f1 = _scores_from_confusion(float(n), *split(boot))
    return DatasetScores(dataset, n, acc, f1, b_acc, b_f1)


def percentile_ci(
    samples: ArrayLike, *, level: float = LEVEL
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Percentile interval along axis 0."""
    s = np.asarray(samples, dtype=np.float64)
    alpha = (1 - level) / 2
    low, high = np.percentile(s, [100 * alpha, 100 * (1 - alpha)], axis=0)
    return low, high


@dataclass(frozen=True)
class BootstrapResult:
    """Scores of M models over several datasets and their equal-weight mean."""

    models: tuple[str, ...]
    datasets: tuple[DatasetScores, ...]
    n_boot: int
    seed: int
    level: float = LEVEL

    @property
    def dataset_names(self) -> tuple[str, ...]:
        return tuple(d.dataset for d in self.datasets)

    def point(self, metric: str, dataset: str = MEAN) -> NDArray[np.float64]:
        """(M,) observed scores; ``dataset="mean"`` averages datasets equally."""
        _check_metric(metric)
        if dataset == MEAN:
            return np.mean([getattr(d, metric) for d in self.datasets], axis=0)
        return getattr(self._dataset(dataset), metric)

    def samples(self, metric: str, dataset: str = MEAN) -> NDArray[np.float64]:
        """(n_boot, M) resampled scores; the mean averages each resample's datasets."""
        _check_metric(metric)
        if dataset == MEAN:
            return np.mean(
                [getattr(d, f"boot_{metric}") for d in self.datasets], axis=0
            )
        return getattr(self._dataset(dataset), f"boot_{metric}")

    def n(self, dataset: str = MEAN) -> int:
        if dataset == MEAN:
            return sum(d.n for d in self.datasets)
        return self._dataset(dataset).n

    def _dataset(self, name: str) -> DatasetScores:
        for d in self.datasets:
            if d.dataset == name:
                return d
        msg = f"no dataset {name!r} in this result; it holds {list(self.dataset_names)}"
        raise KeyError(msg)

    def summary(self) -> pl.DataFrame:
        """One row per (model, dataset or mean, metric): value, ci_low, ci_high, n."""
        rows = []
        for metric in METRICS:
            for name in (*self.dataset_names, MEAN):
                value = self.point(metric, name)
                low, high = percentile_ci(self.samples(metric, name), level=self.level)
                rows += interval_rows(
                    self.models, name, metric, value, low, high, n=self.n(name)
                )
        return pl.DataFrame(rows)


def interval_rows(
    models: Sequence[str],
    dataset: str,
    metric: str,
    value: NDArray[np.float64],
    low: NDArray[np.float64],
    high: NDArray[np.float64],
    *,
    n: int,
) -> list[dict[str, object]]:
    """One summary row per model: model, dataset, metric, value, ci_low, ci_high, n."""
    return [
        {
            "model": model,
            "dataset": dataset,
            "metric": metric,
            "value": float(value[i]),
            "ci_low": float(low[i]),
            "ci_high": float(high[i]),
            "n": n,
        }
        for i, model in enumerate(models)
    ]


def _check_metric(metric: str) -> None:
    if metric not in METRICS:
        msg = f"unknown metric {metric!r}; expected one of {METRICS}"
        raise ValueError(msg)


def _checked(scores: DatasetScores, models: Sequence[str]) -> DatasetScores:
    """``scores`` when it has one prediction row per model; raise otherwise."""
    if scores.accuracy.shape[0] != len(models):
        msg = f"{scores.dataset}: {scores.accuracy.shape[0]} prediction rows for {len(models)} models"
        raise ProbeError(msg)
    return scores


def bootstrap_scores(
    y_true: Mapping[str, ArrayLike],
    preds: Mapping[str, ArrayLike],
    models: Sequence[str],
    *,
    n_boot: int = N_BOOT,
    seed: int = 0,
    level: float = LEVEL,
) -> BootstrapResult:
    """Bootstrap every dataset (same resamples for all models) and their mean.

    Parameters
    ----------
    y_true
        dataset -> (n_d,) labels.
    preds
        dataset -> (M, n_d) predictions, rows in the order of ``models``.
    """
    if set(y_true) != set(preds):
        msg = f"labels cover {sorted(y_true)} but predictions cover {sorted(preds)}"
        raise ProbeError(msg)
    per = [
        _checked(
            bootstrap_dataset(
                y_true[name], preds[name], dataset=name, n_boot=n_boot, seed=seed
            ),
            models,
        )
        for name in y_true
    ]
    return BootstrapResult(tuple(models), tuple(per), n_boot, seed, level)


def cluster_bootstrap_dataset(
    y_true: ArrayLike,
    preds: ArrayLike,
    clusters: ArrayLike,
    *,
    dataset: str,
    n_boot: int = N_BOOT,
    seed: int = 0,
) -> DatasetScores:
    """Like :func:`bootstrap_dataset`, resampling clusters of items instead of items.

    ``clusters`` gives each item's cluster label (0..U-1). Each resample draws U
    clusters with replacement; a resample's score is over all items of the drawn
    clusters (their number varies). The stream is fixed by seed and dataset name and
    differs from the item bootstrap's.
    """
    y, p = check_predictions(y_true, preds, dataset)
    labels = np.unique(np.asarray(clusters), return_inverse=True)[1].reshape(-1)
    cols = np.concatenate([np.ones((1, y.shape[0]), dtype=np.float32), y[None, :]])
    cols = np.concatenate([cols, p, p * y[None, :]], axis=0).T
    n_models = p.shape[0]
    boot = unit_sums(
        cols,
        n_boot=n_boot,
        rng=dataset_rng(seed, f"{dataset}#clusters"),
        units=labels,
    )
    point = cols.sum(axis=0, dtype=np.float64)

    def split(c: NDArray[np.float64]) -> tuple[NDArray[np.float64], ...]:
        return (
            c[..., :1],
            c[..., 1:2],
            c[..., 2 : 2 + n_models],
            c[..., 2 + n_models :],
        )

    acc, f1 = _scores_from_confusion(*split(point))
    b_acc, b_f1 = _scores_from_confusion(*split(boot))
    return DatasetScores(dataset, y.shape[0], acc, f1, b_acc, b_f1)


def cluster_bootstrap_scores(
    y_true: Mapping[str, ArrayLike],
    preds: Mapping[str, ArrayLike],
    clusters: Mapping[str, ArrayLike],
    models: Sequence[str],
    *,
    n_boot: int = N_BOOT,
    seed: int = 0,
    level: float = LEVEL,
) -> BootstrapResult:
    """:func:`bootstrap_scores` with cluster resampling within every dataset."""
    if not set(y_true) == set(preds) == set(clusters):
        msg = (
            f"labels cover {sorted(y_true)}, predictions {sorted(preds)} and clusters "
            f"{sorted(clusters)}; they must cover the same datasets"
        )
        raise ProbeError(msg)
    per = [
        _checked(
            cluster_bootstrap_dataset(
                y_true[name],
                preds[name],
                clusters[name],
                dataset=name,
                n_boot=n_boot,
                seed=seed,
            ),
            models,
        )
        for name in y_true
    ]
    return BootstrapResult(tuple(models), tuple(per), n_boot, seed, level)
