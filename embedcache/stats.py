"""Bootstrap confidence intervals, paired differences and ranks, all vectorised.

Resampling (PROTOCOL.md, "Uncertainty"): each of ``n_boot`` resamples draws the test
items of every dataset with replacement, within that dataset. A resample is held as
counts (how often each item was drawn), so every model's score on every resample is
one matrix product of the counts with the models' 0/1 vectors; macro F1 comes from
the per-resample confusion counts. No probe is refit and there is no Python loop per
resample. All models see the same resamples, which is what makes differences paired.

Ranks: a model's rank is 1 + the number of models *significantly better* than it,
where "significantly better" means the 95% percentile interval of the paired bootstrap
difference (other minus this one, same resamples) lies entirely above 0. Models whose
difference interval contains 0 tie, and tied models share a rank.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from embedcache.errors import ProbeError

if TYPE_CHECKING:
    from numpy.typing import ArrayLike, NDArray

logger = logging.getLogger(__name__)

METRICS = ("accuracy", "macro_f1")
MEAN = "mean"
N_BOOT = 1000
LEVEL = 0.95
# Resamples are generated in blocks so a 25,000-item dataset never needs a
# (1000, 25000) int64 index matrix (200 MB) at once.
_BLOCK_CELLS = 4_000_000


def dataset_rng(seed: int, dataset: str) -> np.random.Generator:
    """The generator for one dataset's resamples: fixed by seed and name only.

    So adding a model or a dataset never changes another dataset's resamples.
    """
    tag = int(hashlib.sha256(dataset.encode("utf-8")).hexdigest()[:8], 16)
    return np.random.default_rng([seed, tag])


def resample_counts(
    n: int, n_boot: int, rng: np.random.Generator
) -> Iterator[NDArray[np.float32]]:
    """Yield blocks of resample counts, shape (block, n): row b counts item draws.

    Each row sums to n (n draws with replacement). float32 holds these integer counts
    and their sums (< 2**24) exactly, and lets the products run through BLAS.
    """
    block = max(1, min(n_boot, _BLOCK_CELLS // max(n, 1)))
    for start in range(0, n_boot, block):
        b = min(block, n_boot - start)
        idx = rng.integers(0, n, size=(b, n))
        idx += (np.arange(b) * n)[:, None]
        counts = np.bincount(idx.ravel(), minlength=b * n).reshape(b, n)
        yield counts.astype(np.float32)


def _f1_pair(
    tp: NDArray[np.float64], fp: NDArray[np.float64], fn: NDArray[np.float64]
) -> NDArray[np.float64]:
    denom = 2 * tp + fp + fn
    return np.divide(2 * tp, denom, out=np.zeros_like(denom), where=denom > 0)


def _scores_from_confusion(
    n: float,
    pos: NDArray[np.float64],
    pred_pos: NDArray[np.float64],
    tp: NDArray[np.float64],
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Accuracy and macro F1 from counts; pos broadcasts against pred_pos and tp."""
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


def _check_predictions(
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
    y, p = _check_predictions(y_true, preds, dataset)
    n = y.shape[0]
    # Columns: [y, pred_1..M, y*pred_1..M] -> positives, predicted positives, tp.
    cols = np.concatenate([y[None, :], p, p * y[None, :]], axis=0).T
    n_models = p.shape[0]
    boot = np.empty((n_boot, cols.shape[1]), dtype=np.float64)
    start = 0
    for counts in resample_counts(n, n_boot, dataset_rng(seed, dataset)):
        boot[start : start + counts.shape[0]] = counts @ cols
        start += counts.shape[0]
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
                for i, model in enumerate(self.models):
                    rows.append(
                        {
                            "model": model,
                            "dataset": name,
                            "metric": metric,
                            "value": float(value[i]),
                            "ci_low": float(low[i]),
                            "ci_high": float(high[i]),
                            "n": self.n(name),
                        }
                    )
        return pl.DataFrame(rows)


def _check_metric(metric: str) -> None:
    if metric not in METRICS:
        msg = f"unknown metric {metric!r}; expected one of {METRICS}"
        raise ValueError(msg)


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
    per = []
    for name in y_true:
        scores = bootstrap_dataset(
            y_true[name], preds[name], dataset=name, n_boot=n_boot, seed=seed
        )
        if scores.accuracy.shape[0] != len(models):
            msg = f"{name}: {scores.accuracy.shape[0]} prediction rows for {len(models)} models"
            raise ProbeError(msg)
        per.append(scores)
    return BootstrapResult(tuple(models), tuple(per), n_boot, seed, level)


def paired_differences(
    result: BootstrapResult,
    *,
    metric: str = "accuracy",
    dataset: str = MEAN,
    reference: str | None = None,
) -> pl.DataFrame:
    """Paired bootstrap of (reference - model) for each model, on the same resamples.

    ``reference`` defaults to the model with the best observed score. A model is
    indistinguishable from the reference when the difference's interval contains 0.
    """
    point = result.point(metric, dataset)
    samples = result.samples(metric, dataset)
    ref = int(np.argmax(point)) if reference is None else result.models.index(reference)
    diff = samples[:, [ref]] - samples
    low, high = percentile_ci(diff, level=result.level)
    return pl.DataFrame(
        {
            "reference": [result.models[ref]] * len(result.models),
            "model": list(result.models),
            "dataset": [dataset] * len(result.models),
            "metric": [metric] * len(result.models),
            "difference": (point[ref] - point).tolist(),
            "ci_low": low.tolist(),
            "ci_high": high.tolist(),
            "indistinguishable": ((low <= 0) & (high >= 0)).tolist(),
        }
    )


def better_matrix(samples: ArrayLike, *, level: float = LEVEL) -> NDArray[np.bool_]:
    """(M, M) bool: entry [i, j] says model j is significantly better than model i.

    "Significantly better": the percentile interval of the paired difference
    samples[:, j] - samples[:, i] lies entirely above 0.
    """
    s = np.asarray(samples, dtype=np.float64)
    diff = s[:, None, :] - s[:, :, None]  # [b, i, j] = s_j - s_i
    low, _ = percentile_ci(diff, level=level)
    return low > 0


def significance_ranks(
    samples: ArrayLike, *, level: float = LEVEL
) -> NDArray[np.int64]:
    """Rank = 1 + number of models significantly better; ties share a rank."""
    return 1 + better_matrix(samples, level=level).sum(axis=1).astype(np.int64)
