"""Paired comparisons on the bootstrap's resamples: differences, ranks, subset gaps.

All models see the same resamples, which is what makes differences paired.

Ranks: a model's rank is 1 + the number of models *significantly better* than it,
where "significantly better" means the 95% percentile interval of the paired bootstrap
difference (other minus this one, same resamples) lies entirely above 0. Models whose
difference interval contains 0 tie, and tied models share a rank.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from embedcache.analysis.bootstrap import (
    LEVEL,
    MEAN,
    N_BOOT,
    BootstrapResult,
    check_predictions,
    percentile_ci,
)
from embedcache.analysis.resampling import dataset_rng, unit_sums
from embedcache.errors import ProbeError

if TYPE_CHECKING:
    from numpy.typing import ArrayLike, NDArray


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
        y, p = check_predictions(y_true[name], preds[name], name)
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
