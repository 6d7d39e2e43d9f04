"""Leakage-clean scores: accuracy on the test items with no duplicate in the drawn train.

A test item is *clean* when the leakage audit finds no exact, reverse-complement or
near duplicate of it among its dataset's drawn train items (:mod:`embedcache.analysis.leakage`).
``accuracy_clean`` is the probe's accuracy on the clean items only, with the protocol's
bootstrap over those items (1,000 resamples within each dataset, the mean over
datasets with equal weight) and ``n`` = the number of clean items. The gap
``accuracy - accuracy_clean`` is bootstrapped paired: both accuracies come from one
resample of all test items (:func:`embedcache.analysis.paired.subset_gap`), with the item
bootstrap and, when clusters are given, the cluster bootstrap.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from embedcache.analysis.bootstrap import (
    MEAN,
    BootstrapResult,
    bootstrap_scores,
    interval_rows,
    percentile_ci,
)
from embedcache.analysis.clusters import check_aligned
from embedcache.analysis.paired import SubsetGap, significance_ranks, subset_gap

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from embedcache.analysis.clusters import ClusterLabels
    from embedcache.analysis.evaluation import Evaluation
    from embedcache.analysis.leakage import DatasetAudit

logger = logging.getLogger(__name__)

METRIC = "accuracy_clean"


@dataclass(frozen=True)
class CleanScores:
    """Accuracy on clean test items, and its paired gap to accuracy on all items."""

    models: tuple[str, ...]
    datasets: tuple[str, ...]
    n_clean: dict[str, int]  # dataset or mean -> clean items
    bootstrap: BootstrapResult | None  # over datasets with a clean item; None if none
    gap: SubsetGap  # accuracy - accuracy_clean, item bootstrap
    gap_clustered: SubsetGap | None  # same, cluster bootstrap

    @property
    def complete(self) -> bool:
        """Every dataset has a clean item, so the mean over datasets exists."""
        return all(self.n_clean[d] > 0 for d in self.datasets)

    def point(self, dataset: str = MEAN) -> NDArray[np.float64]:
        """(M,) clean accuracy; NaN where the dataset (or, for the mean, any) has none."""
        if self.bootstrap is None or (dataset == MEAN and not self.complete):
            return np.full(len(self.models), np.nan)
        if dataset != MEAN and self.n_clean[dataset] == 0:
            return np.full(len(self.models), np.nan)
        return self.bootstrap.point("accuracy", dataset)

    def samples(self, dataset: str = MEAN) -> NDArray[np.float64]:
        """(n_boot, M) resampled clean accuracy (NaN as in :meth:`point`)."""
        if np.isnan(self.point(dataset)).all():
            n_boot = self.bootstrap.n_boot if self.bootstrap is not None else 1
            return np.full((n_boot, len(self.models)), np.nan)
        assert self.bootstrap is not None
        return self.bootstrap.samples("accuracy", dataset)

    def summary(self) -> pl.DataFrame:
        """model, dataset, metric (accuracy_clean), value, ci_low, ci_high, n."""
        rows = []
        for name in (*self.datasets, MEAN):
            value = self.point(name)
            if np.isnan(value).all():
                low = high = value
            else:
                level = self.bootstrap.level if self.bootstrap else 0.95
                low, high = percentile_ci(self.samples(name), level=level)
            rows += interval_rows(
                self.models, name, METRIC, value, low, high, n=self.n_clean[name]
            )
        return pl.DataFrame(rows)


def clean_scores(
    evaluation: Evaluation,
    audits: Mapping[str, DatasetAudit],
    *,
    clusters: Mapping[str, ClusterLabels] | None = None,
) -> CleanScores:
    """Score every model of ``evaluation`` on the clean test items of each dataset.

    ``audits`` comes from :func:`embedcache.analysis.leakage.audit_datasets` on the same subset
    (its item order is checked). Same resample count and seed as the evaluation.
    """
    check_aligned(
        evaluation, {d: a.item_ids for d, a in audits.items()}, "the leakage audit"
    )
    datasets = evaluation.datasets
    models = [e.name for e in evaluation.entries]
    boot = evaluation.bootstrap
    masks = {d: np.asarray(audits[d].clean, dtype=bool) for d in datasets}
    n_clean = {d: int(masks[d].sum()) for d in datasets}
    n_clean[MEAN] = sum(n_clean[d] for d in datasets)
    with_clean = [d for d in datasets if n_clean[d] > 0]
    clean_boot = None
    if with_clean:
        clean_boot = bootstrap_scores(
            {d: evaluation.labels[d][masks[d]] for d in with_clean},
            {d: evaluation.predictions[d][:, masks[d]] for d in with_clean},
            models,
            n_boot=boot.n_boot,
            seed=evaluation.seed,
            level=boot.level,
        )
    for d in datasets:
        if n_clean[d] == 0:
            logger.warning("%s: no clean test item; accuracy_clean is undefined", d)
    common = {
        "y_true": {d: evaluation.labels[d] for d in datasets},
        "preds": {d: evaluation.predictions[d] for d in datasets},
        "masks": masks,
        "models": models,
        "n_boot": boot.n_boot,
        "seed": evaluation.seed,
        "level": boot.level,
    }
    gap = subset_gap(**common)
    gap_clustered = None
    if clusters is not None:
        check_aligned(
            evaluation, {d: c.item_ids for d, c in clusters.items()}, "the clusters"
        )
        gap_clustered = subset_gap(
            **common, clusters={d: clusters[d].labels for d in datasets}
        )
    return CleanScores(tuple(models), datasets, n_clean, clean_boot, gap, gap_clustered)


def clean_rank_changes(evaluation: Evaluation, clean: CleanScores) -> pl.DataFrame:
    """Ranked models: rank on accuracy vs rank on accuracy_clean, flagged when they differ.

    Both ranks follow the leaderboard's rule (1 + the number of models significantly
    better by a paired bootstrap CI entirely above 0). With no mean clean accuracy
    (a dataset without clean items) ``rank_clean`` is null and nothing is flagged.
    """
    ranking = evaluation.ranking()
    if not ranking.height:
        return pl.DataFrame(
            schema={"model": pl.Utf8, "rank": pl.Int64, "rank_clean": pl.Int64}
        )
    names = ranking["model"].to_list()
    cols = [clean.models.index(n) for n in names]
    if clean.complete and clean.bootstrap is not None:
        level = clean.bootstrap.level
        clean_ranks: list[int | None] = significance_ranks(
            clean.samples(MEAN)[:, cols], level=level
        ).tolist()
    else:
        clean_ranks = [None] * len(names)
    position_clean: list[int | None] = [None] * len(names)
    if clean.complete:
        order = np.argsort(-clean.point(MEAN)[cols], kind="stable")
        for pos, j in enumerate(order, start=1):
            position_clean[int(j)] = pos
    return pl.DataFrame(
        {
            "model": names,
            "rank": ranking["rank"].to_list(),
            "rank_clean": clean_ranks,
            "position": list(range(1, len(names) + 1)),
            "position_clean": position_clean,
            "rank_changed": [
                c is not None and c != r
                for c, r in zip(clean_ranks, ranking["rank"].to_list(), strict=True)
            ],
        },
        schema_overrides={"rank_clean": pl.Int64, "position_clean": pl.Int64},
    )
