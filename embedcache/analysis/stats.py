"""Bootstrap confidence intervals, paired differences and ranks, all vectorised.

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


def unit_sums(
    cols: ArrayLike,
    *,
    n_boot: int,
    rng: np.random.Generator,
    units: ArrayLike | None = None,
) -> NDArray[np.float64]:
    """(n_boot, c) column sums of resampled items.

    Parameters
    ----------
    cols
        (n, c) per-item values (counts: 0/1 indicators and their products).
    units
        None: resample items. Otherwise (n,) integer cluster labels 0..U-1: each
        resample draws U clusters with replacement and sums their items' columns.
    """
    arr = np.asarray(cols, dtype=np.float32)
    if units is None:
        agg = arr
    else:
        labels = np.asarray(units, dtype=np.int64)
        if labels.shape != (arr.shape[0],):
            msg = (
                f"cluster labels have shape {labels.shape}; expected ({arr.shape[0]},)"
            )
            raise ProbeError(msg)
        n_units = int(labels.max()) + 1 if labels.size else 0
        agg = np.zeros((n_units, arr.shape[1]), dtype=np.float32)
        np.add.at(agg, labels, arr)
    out = np.empty((n_boot, arr.shape[1]), dtype=np.float64)
    start = 0
    for counts in resample_counts(agg.shape[0], n_boot, rng):
        out[start : start + counts.shape[0]] = counts @ agg
        start += counts.shape[0]
    return out


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
    boot = unit_sums(cols, n_boot=n_boot, rng=dataset_rng(seed, dataset))
    point = cols.sum(axis=0, dtype=np.float64)

    def split(c: NDArray[np.float64]) -> tuple[NDArray[np.float64], ...]:
        return c[..., :1], c[..., 1 : 1 + n_models], c[..., 1 + n_models :]

    acc, f1 = _scores_from_confusion(float(n), *split(point))
    b_acc, b_f1 = _scores_from_confusion(float(n), *split(boot))
    return DatasetScores(dataset, n, acc, f1, b_acc, b_f1)


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
    y, p = _check_predictions(y_true, preds, dataset)
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
    per = []
    for name in y_true:
        scores = cluster_bootstrap_dataset(
            y_true[name],
            preds[name],
            clusters[name],
            dataset=name,
            n_boot=n_boot,
            seed=seed,
        )
        if scores.accuracy.shape[0] != len(models):
            msg = f"{name}: {scores.accuracy.shape[0]} prediction rows for {len(models)} models"
            raise ProbeError(msg)
        per.append(scores)
    return BootstrapResult(tuple(models), tuple(per), n_boot, seed, level)


@dataclass(frozen=True)
class SubsetGap:
    """Accuracy on all items minus accuracy on a subset of them, per model, paired.

    Both accuracies come from the same resample of all items (the subset's share of
    each resample varies), so the interval is of a paired difference.
    """

    models: tuple[str, ...]
    datasets: tuple[str, ...]
    point: dict[str, NDArray[np.float64]]  # dataset or mean -> (M,)
    samples: dict[str, NDArray[np.float64]]  # dataset or mean -> (n_boot, M), NaN-free
    level: float = LEVEL

    def frame(self) -> pl.DataFrame:
        """model, dataset, difference, ci_low, ci_high, excludes_zero."""
        rows = []
        for name in (*self.datasets, MEAN):
            low, high = percentile_ci(self.samples[name], level=self.level)
            for i, model in enumerate(self.models):
                rows.append(
                    {
                        "model": model,
                        "dataset": name,
                        "difference": float(self.point[name][i]),
                        "ci_low": float(low[i]),
                        "ci_high": float(high[i]),
                        "excludes_zero": bool(low[i] > 0 or high[i] < 0),
                    }
                )
        return pl.DataFrame(rows)


def subset_gap(
    y_true: Mapping[str, ArrayLike],
    preds: Mapping[str, ArrayLike],
    masks: Mapping[str, ArrayLike],
    models: Sequence[str],
    *,
    n_boot: int = N_BOOT,
    seed: int = 0,
    level: float = LEVEL,
    clusters: Mapping[str, ArrayLike] | None = None,
) -> SubsetGap:
    """Paired bootstrap of accuracy(all items) - accuracy(items where mask is True).

    Item resampling uses each dataset's own stream (:func:`dataset_rng`), so the
    all-items half of every resample is the protocol's resample. With ``clusters``,
    whole clusters are resampled instead (the cluster bootstrap's stream). A resample
    that happens to hold no subset item is dropped: the interval is over the
    resamples where both accuracies exist (with 20 or more subset items this
    essentially never happens). The mean is over datasets with equal weight; a
    dataset with no subset item makes every difference NaN.
    """
    point: dict[str, NDArray[np.float64]] = {}
    samples: dict[str, NDArray[np.float64]] = {}
    for name in y_true:
        y, p = _check_predictions(y_true[name], preds[name], name)
        mask = np.asarray(masks[name], dtype=bool)
        if mask.shape != y.shape:
            msg = f"{name}: subset mask has shape {mask.shape}; expected {y.shape}"
            raise ProbeError(msg)
        correct = (p == y[None, :]).astype(np.float32)  # (M, n)
        m = mask.astype(np.float32)
        ones = np.ones((1, y.shape[0]), dtype=np.float32)
        # Columns: [1, correct_1..M, correct_1..M on the subset, in subset].
        cols = np.concatenate([ones, correct, correct * m[None, :], m[None, :]]).T
        n_models = p.shape[0]
        if clusters is None:
            rng = dataset_rng(seed, name)
            units = None
        else:
            rng = dataset_rng(seed, f"{name}#clusters")
            units = np.unique(np.asarray(clusters[name]), return_inverse=True)[1]
            units = units.reshape(-1)
        boot = unit_sums(cols, n_boot=n_boot, rng=rng, units=units)
        n_all, n_sub = boot[:, :1], boot[:, -1:]
        with np.errstate(divide="ignore", invalid="ignore"):
            diff = (
                boot[:, 1 : 1 + n_models] / n_all
                - boot[:, 1 + n_models : 1 + 2 * n_models] / n_sub
            )
        point_sub = (
            correct[:, mask].mean(axis=1, dtype=np.float64) if mask.any() else np.nan
        )
        point[name] = correct.mean(axis=1, dtype=np.float64) - point_sub
        samples[name] = diff
    names = tuple(y_true)
    stacked = np.stack([samples[d] for d in names])
    point[MEAN] = np.mean([point[d] for d in names], axis=0)
    samples[MEAN] = stacked.mean(axis=0)
    for name in (*names, MEAN):
        keep = np.isfinite(samples[name]).all(axis=1)
        if keep.any():
            samples[name] = samples[name][keep]
        else:
            samples[name] = np.full((1, len(models)), np.nan)
    return SubsetGap(tuple(models), names, point, samples, level)


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
