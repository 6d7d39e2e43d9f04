"""Near-duplicate clusters of test items and the cluster-aware intervals built on them.

Near-duplicate test items are not independent draws, so an interval that resamples
items as if they were is too narrow. Within each dataset's test set, two items are
linked when they are near duplicates by the leakage audit's own rule (identical or
reverse complement, or 8-mer set Jaccard >= 0.9 on either strand, N-holding k-mers
skipped); clusters are the connected components of that graph (single linkage, so a
chain of near duplicates is one cluster). The second interval resamples clusters
(:func:`embedcache.analysis.bootstrap.cluster_bootstrap_scores`); the protocol's item bootstrap
stays the headline.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl
from scipy import sparse
from scipy.sparse.csgraph import connected_components

from embedcache.analysis.bootstrap import (
    MEAN,
    BootstrapResult,
    cluster_bootstrap_scores,
    percentile_ci,
)
from embedcache.analysis.leakage import (
    THRESHOLD,
    K,
    KmerIndex,
    kmer_set_matrix,
    near_pairs,
    reverse_complement_sets,
)
from embedcache.errors import AnalysisInputError
from embedcache.hashing import normalise_sequence, reverse_complement

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from embedcache.analysis.evaluation import Evaluation

logger = logging.getLogger(__name__)

METRIC = "accuracy_cluster_ci"
METHOD = (
    "single-linkage clusters of test items: identical, reverse complement, or "
    f"{K}-mer set Jaccard >= {THRESHOLD} on either strand (N-holding k-mers skipped)"
)


def near_duplicate_clusters(
    seqs: Sequence[str], *, k: int = K, threshold: float = THRESHOLD
) -> NDArray[np.int64]:
    """Cluster label of each sequence (0..U-1, in order of first appearance)."""
    norm = [normalise_sequence(s) for s in seqs]
    n = len(norm)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    # Identity on either strand links sequences too short to hold one k-mer as well.
    first: dict[str, int] = {}
    same_a, same_b = [], []
    for i, s in enumerate(norm):
        j = first.setdefault(min(s, reverse_complement(s)), i)
        if j != i:
            same_a.append(j)
            same_b.append(i)
    sets = kmer_set_matrix(norm, k=k)
    index = KmerIndex.build(sets)
    fwd_a, fwd_b = near_pairs(sets, index, threshold=threshold, skip_diagonal=True)
    rc_a, rc_b = near_pairs(
        reverse_complement_sets(sets, k=k),
        index,
        threshold=threshold,
        skip_diagonal=True,
    )
    a = np.concatenate([np.asarray(same_a, dtype=np.int64), fwd_a, rc_a])
    b = np.concatenate([np.asarray(same_b, dtype=np.int64), fwd_b, rc_b])
    graph = sparse.coo_matrix((np.ones(a.size, dtype=np.int8), (a, b)), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    # Relabel in order of first appearance, so labels do not depend on scipy's order.
    _, first_pos, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(first_pos.size, dtype=np.int64)
    rank[np.argsort(first_pos, kind="stable")] = np.arange(first_pos.size)
    return rank[inverse.reshape(-1)]


@dataclass(frozen=True)
class ClusterLabels:
    """One dataset's test items (in the subset's order) and their cluster labels."""

    dataset: str
    item_ids: tuple[str, ...]
    labels: NDArray[np.int64]

    @property
    def n_clusters(self) -> int:
        return int(self.labels.max()) + 1 if self.labels.size else 0

    @property
    def largest(self) -> int:
        return int(np.bincount(self.labels).max()) if self.labels.size else 0


def cluster_test_items(
    items: pl.DataFrame, *, k: int = K, threshold: float = THRESHOLD
) -> dict[str, ClusterLabels]:
    """Clusters of every dataset's test items (columns dataset, split, item_id, seq)."""
    out: dict[str, ClusterLabels] = {}
    for dataset in sorted(items["dataset"].unique().to_list()):
        test = items.filter(
            (pl.col("dataset") == dataset) & (pl.col("split") == "test")
        )
        labels = near_duplicate_clusters(
            test["seq"].to_list(), k=k, threshold=threshold
        )
        out[dataset] = ClusterLabels(dataset, tuple(test["item_id"].to_list()), labels)
        logger.info(
            "clusters %s: %d test items in %d clusters (largest %d)",
            dataset,
            test.height,
            out[dataset].n_clusters,
            out[dataset].largest,
        )
    return out


def check_aligned(
    evaluation: Evaluation, item_ids: Mapping[str, Sequence[str]], what: str
) -> None:
    """Raise unless ``item_ids`` lists every dataset's test items in the scored order."""
    for name in evaluation.datasets:
        if name not in item_ids:
            msg = f"{what} has no dataset {name!r}; compute it from the same subset"
            raise AnalysisInputError(msg)
        if tuple(item_ids[name]) != tuple(evaluation.item_ids[name]):
            msg = (
                f"{what} of {name} lists other test items than the evaluation "
                f"({len(item_ids[name])} vs {len(evaluation.item_ids[name])}); compute "
                "both from the same subset"
            )
            raise AnalysisInputError(msg)


@dataclass(frozen=True)
class ClusterScores:
    """Scores of an evaluation's models with cluster-resampled intervals."""

    bootstrap: BootstrapResult
    n_clusters: dict[str, int]  # dataset or mean -> clusters
    clusters: dict[str, ClusterLabels]

    def summary(self) -> pl.DataFrame:
        """model, dataset, metric, value, ci_low, ci_high, n (items), n_clusters."""
        return self.bootstrap.summary().with_columns(
            pl.col("dataset").replace_strict(self.n_clusters).alias("n_clusters")
        )

    def results_summary(self) -> pl.DataFrame:
        """Rows for results.csv: metric ``accuracy_cluster_ci``, n = clusters.

        The value is the protocol's accuracy; only the interval (cluster bootstrap)
        and n (number of clusters) differ from the ``accuracy`` rows.
        """
        return (
            self.summary()
            .filter(pl.col("metric") == "accuracy")
            .with_columns(
                pl.lit(METRIC).alias("metric"), pl.col("n_clusters").alias("n")
            )
            .drop("n_clusters")
        )


def cluster_scores(
    evaluation: Evaluation,
    clusters: Mapping[str, ClusterLabels],
    *,
    n_boot: int | None = None,
    seed: int | None = None,
) -> ClusterScores:
    """Every model's scores with intervals that resample clusters of test items.

    Same models, predictions, resample count and seed as ``evaluation``; only the
    resampling unit differs.
    """
    check_aligned(
        evaluation, {d: c.item_ids for d, c in clusters.items()}, "the clusters"
    )
    datasets = evaluation.datasets
    boot = cluster_bootstrap_scores(
        {d: evaluation.labels[d] for d in datasets},
        {d: evaluation.predictions[d] for d in datasets},
        {d: clusters[d].labels for d in datasets},
        [e.name for e in evaluation.entries],
        n_boot=n_boot or evaluation.bootstrap.n_boot,
        seed=evaluation.seed if seed is None else seed,
        level=evaluation.bootstrap.level,
    )
    counts = {d: clusters[d].n_clusters for d in datasets}
    counts[MEAN] = sum(counts.values())
    return ClusterScores(boot, counts, {d: clusters[d] for d in datasets})


def paired_to_best(
    evaluation: Evaluation,
    clustered: ClusterScores,
    *,
    metric: str = "accuracy",
    dataset: str = MEAN,
) -> pl.DataFrame:
    """Paired difference of every entry to the top ranked model, item and cluster CIs.

    Columns: reference, model, difference (model - reference), ci_low, ci_high (item
    bootstrap), cluster_ci_low, cluster_ci_high (cluster bootstrap), and whether each
    interval contains 0.
    """
    ranking = evaluation.ranking(metric=metric)
    names = [e.name for e in evaluation.entries]
    if not ranking.height:
        return pl.DataFrame()
    reference = ranking["model"][0]
    ref = evaluation.bootstrap.models.index(reference)
    point = evaluation.bootstrap.point(metric, dataset)
    rows = []
    item_s = evaluation.bootstrap.samples(metric, dataset)
    clus_s = clustered.bootstrap.samples(metric, dataset)
    i_low, i_high = percentile_ci(
        item_s - item_s[:, [ref]], level=evaluation.bootstrap.level
    )
    c_low, c_high = percentile_ci(
        clus_s - clus_s[:, [ref]], level=evaluation.bootstrap.level
    )
    for name in names:
        i = evaluation.bootstrap.models.index(name)
        rows.append(
            {
                "reference": reference,
                "model": name,
                "dataset": dataset,
                "difference": float(point[i] - point[ref]),
                "ci_low": float(i_low[i]),
                "ci_high": float(i_high[i]),
                "cluster_ci_low": float(c_low[i]),
                "cluster_ci_high": float(c_high[i]),
                "item_ci_has_0": bool(i_low[i] <= 0 <= i_high[i]),
                "cluster_ci_has_0": bool(c_low[i] <= 0 <= c_high[i]),
            }
        )
    return pl.DataFrame(rows)
