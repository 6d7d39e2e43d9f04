"""Run every analysis beside the leaderboard on one evaluated subset.

Leakage-clean accuracy (:mod:`embedcache.analysis.clean`), cluster-aware intervals
(:mod:`embedcache.analysis.clusters`), the optional full-train audit
(:func:`embedcache.analysis.leakage.full_train_audit`), label-efficiency curves
(:mod:`embedcache.analysis.curves`), the pretraining gain (:mod:`embedcache.analysis.pretraining`) and
the layer sweep (:mod:`embedcache.analysis.layers`) and reverse-complement robustness
(:mod:`embedcache.analysis.rc`), computed once and handed to the report.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import polars as pl

from embedcache.analysis.clean import CleanScores, clean_rank_changes, clean_scores
from embedcache.analysis.clusters import (
    ClusterLabels,
    ClusterScores,
    cluster_scores,
    cluster_test_items,
    paired_to_best,
)
from embedcache.analysis.curves import N_TRAIN_GRID, Curves, label_efficiency
from embedcache.analysis.layers import LayerSweeps, layer_sweeps
from embedcache.analysis.leakage import DatasetAudit, audit_datasets, full_train_audit
from embedcache.analysis.pretraining import pretraining_gain
from embedcache.analysis.rc import RcScores, rc_scores

if TYPE_CHECKING:
    from pathlib import Path

    from embedcache.analysis.evaluation import Evaluation
    from embedcache.analysis.vectors import VectorStore
    from embedcache.data.subsets import Subset

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Analyses:
    """Everything the analyses computed for one evaluation."""

    audits: dict[str, DatasetAudit]
    clusters: dict[str, ClusterLabels]
    clustered: ClusterScores
    clean: CleanScores
    rank_changes: pl.DataFrame
    paired: pl.DataFrame  # Δ to the top model, item and cluster CIs
    full_train: pl.DataFrame | None
    curves: Curves | None
    pretraining: pl.DataFrame  # gain of each trained model over its random-init twin
    layers: LayerSweeps | None
    seconds: dict[str, float] = field(default_factory=dict)
    rc: RcScores | None = None  # accuracy_rc and cosines, models with stored RCs

    def results(self, evaluation: Evaluation) -> pl.DataFrame:
        """``evaluation.results`` plus the accuracy_clean, accuracy_cluster_ci and
        (last, where reverse complements are stored) accuracy_rc rows."""
        frames = [
            evaluation.results,
            evaluation.analysis_results(self.clean.summary()),
            evaluation.analysis_results(self.clustered.results_summary()),
        ]
        if self.rc is not None and self.rc.bootstrap is not None:
            frames.append(evaluation.analysis_results(self.rc.summary()))
        return pl.concat(frames)


def run_analyses(
    subset: Subset,
    store: VectorStore,
    evaluation: Evaluation,
    *,
    data_dir: Path | str | None = None,
    curve_sizes: Sequence[int] = N_TRAIN_GRID,
    full_train: bool = True,
    curves: bool = True,
    layers: bool = True,
    rc: bool = True,
) -> Analyses:
    """Audit, cluster, clean-score, full-train-audit and curve one evaluated subset.

    Uses the evaluation's models, resample count, seed and probe config.
    """
    seconds: dict[str, float] = {}

    def timed(name: str, start: float) -> None:
        seconds[name] = time.perf_counter() - start
        logger.info("analysis %s took %.1f s", name, seconds[name])

    t = time.perf_counter()
    audits = audit_datasets(subset.items)
    timed("leakage audit", t)
    t = time.perf_counter()
    test_clusters = cluster_test_items(subset.items)
    timed("test clusters", t)
    t = time.perf_counter()
    clustered = cluster_scores(evaluation, test_clusters)
    clean = clean_scores(evaluation, audits, clusters=test_clusters)
    changes = clean_rank_changes(evaluation, clean)
    paired = paired_to_best(evaluation, clustered)
    timed("clean and cluster bootstrap", t)
    full = None
    if full_train:
        t = time.perf_counter()
        full = full_train_audit(subset, data_dir=data_dir)
        timed("full-train audit", t)
    curve = None
    if curves:
        t = time.perf_counter()
        curve = label_efficiency(
            subset,
            store,
            evaluation.entries,
            sizes=curve_sizes,
            n_boot=evaluation.bootstrap.n_boot,
            seed=evaluation.seed,
            probe_config=evaluation.probe_config,
            board=evaluation,
        )
        timed("label-efficiency curves", t)
    t = time.perf_counter()
    pretraining = pretraining_gain(evaluation)
    sweeps = None
    if layers:
        names = {e.key: e.name for e in evaluation.entries if e.key is not None}
        sweeps = layer_sweeps(
            subset,
            store,
            model_name=names,
            n_boot=evaluation.bootstrap.n_boot,
            seed=evaluation.seed,
            probe_config=evaluation.probe_config,
        )
    timed("pretraining gain and layer sweep", t)
    robustness = None
    if rc:
        t = time.perf_counter()
        robustness = rc_scores(subset, store, evaluation)
        timed("reverse-complement robustness", t)
    return Analyses(
        audits=audits,
        clusters=test_clusters,
        clustered=clustered,
        clean=clean,
        rank_changes=changes,
        paired=paired,
        full_train=full,
        curves=curve,
        pretraining=pretraining,
        layers=sweeps,
        seconds=seconds,
        rc=robustness,
    )
