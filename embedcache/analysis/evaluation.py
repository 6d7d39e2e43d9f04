"""Score a drawn subset: store vectors -> probes -> bootstrap -> an :class:`Evaluation`.

Ties a :class:`~embedcache.data.subsets.Subset`, an embedding store and model keys
(chosen by :mod:`embedcache.analysis.selection`) into per-model predictions,
bootstrap intervals, ranks and the ``results.csv`` frame
(:mod:`embedcache.analysis.results`). The best K of the k-mer floors is the one with
the highest mean test accuracy: a generous floor, so a model has to beat the
strongest k-mer probe, not a chosen one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from embedcache.analysis.bootstrap import (
    MEAN,
    N_BOOT,
    BootstrapResult,
    bootstrap_scores,
    percentile_ci,
)
from embedcache.analysis.paired import paired_differences, significance_ranks
from embedcache.analysis.probe import (
    ProbeConfig,
    ProbeFit,
    fit_probe,
    majority_label,
)
from embedcache.analysis.results import analysis_rows, results_frame
from embedcache.analysis.selection import (
    FLOOR_ADAPTER,
    ModelEntry,
    key_aliases,
    key_of,
    select_models,
)
from embedcache.analysis.vectors import (
    check_complete,
    load_vectors,
    predict_with_proba,
)

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from embedcache.analysis.vectors import VectorStore
    from embedcache.data.subsets import Subset

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Evaluation:
    """Everything a report shows about one version."""

    version: str
    comparable: bool
    subset_id: str
    ranked: tuple[ModelEntry, ...]
    floors: tuple[ModelEntry, ...]
    fallback: bool
    datasets: tuple[str, ...]
    item_ids: dict[str, list[str]]  # dataset -> test item ids, in prediction order
    labels: dict[str, NDArray[np.int64]]  # dataset -> (n,)
    predictions: dict[str, NDArray[np.int64]]  # dataset -> (M, n), rows as `entries`
    probes: pl.DataFrame  # model, dataset, C, cv_log_loss
    bootstrap: BootstrapResult
    usual_n: dict[str, int]  # dataset or "mean" -> the board's usual n
    probe_config: ProbeConfig
    seed: int
    results: pl.DataFrame = field(repr=False)
    # dataset -> (M, n) probability of label 1, rows as `entries` (predictions.parquet)
    probabilities: dict[str, NDArray[np.float64]] = field(
        default_factory=dict, repr=False
    )
    # (model, dataset) -> the fitted probe, reused by scores on other inputs (RC)
    fits: dict[tuple[str, str], ProbeFit] = field(default_factory=dict, repr=False)

    @property
    def entries(self) -> tuple[ModelEntry, ...]:
        return self.ranked + self.floors

    def entry(self, name: str) -> ModelEntry:
        found = next((e for e in self.entries if e.name == name), None)
        if found is None:
            msg = f"no model {name!r} in this evaluation; it holds {[e.name for e in self.entries]}"
            raise KeyError(msg)
        return found

    def analysis_results(self, summary: pl.DataFrame) -> pl.DataFrame:
        """``results.csv`` rows for an analysis of this evaluation (new metrics, same
        columns); ``summary``: model, dataset, metric, value, ci_low, ci_high, n."""
        return analysis_rows(
            summary,
            self.entries,
            version=self.version,
            subset_id=self.subset_id,
            datasets=self.datasets,
        )

    def ranking(self, *, metric: str = "accuracy") -> pl.DataFrame:
        """Ranked models only: rank (ties share), value, CI, n and the paired Δ to the best."""
        names = [e.name for e in self.ranked]
        if not names:
            return pl.DataFrame(
                schema={"rank": pl.Int64, "model": pl.Utf8, "value": pl.Float64}
            )
        cols = [self.bootstrap.models.index(n) for n in names]
        samples = self.bootstrap.samples(metric)[:, cols]
        point = self.bootstrap.point(metric)[cols]
        low, high = percentile_ci(samples, level=self.bootstrap.level)
        best = int(np.argmax(point))
        d_low, d_high = percentile_ci(
            samples[:, [best]] - samples, level=self.bootstrap.level
        )
        frame = pl.DataFrame(
            {
                "rank": significance_ranks(samples, level=self.bootstrap.level),
                "model": names,
                "model_key": [e.model_key for e in self.ranked],
                "value": point,
                "ci_low": low,
                "ci_high": high,
                "n": [self.bootstrap.n(MEAN)] * len(names),
                "diff_to_best": point[best] - point,
                "diff_ci_low": d_low,
                "diff_ci_high": d_high,
                "indistinguishable_from_best": (d_low <= 0) & (d_high >= 0),
            }
        )
        return frame.sort(["rank", "value"], descending=[False, True])

    def best_kmer(self) -> ModelEntry | None:
        """The k-mer floor with the highest mean test accuracy (None without k-mer keys)."""
        kmers = [
            e
            for e in self.entries
            if e.key is not None and e.key.adapter == FLOOR_ADAPTER
        ]
        if not kmers:
            return None
        point = self.bootstrap.point("accuracy")
        return max(kmers, key=lambda e: point[self.bootstrap.models.index(e.name)])

    def paired(self, *, metric: str = "accuracy", dataset: str = MEAN) -> pl.DataFrame:
        """Paired bootstrap differences of every model and floor to the best ranked model."""
        ranking = self.ranking(metric=metric)
        reference = ranking["model"][0] if ranking.height else None
        return paired_differences(
            self.bootstrap, metric=metric, dataset=dataset, reference=reference
        )


def evaluate(
    subset: Subset,
    store: VectorStore,
    *,
    models: Sequence[str] = (),
    n_boot: int = N_BOOT,
    seed: int = 0,
    probe_config: ProbeConfig | None = None,
) -> Evaluation:
    """Fit every probe, predict every test item, bootstrap, and build the results frame."""
    config = probe_config or ProbeConfig()
    version = subset.version
    infos = store.keys()
    keys = [key_of(info) for info in infos]
    ranked, floors, fallback = select_models(
        keys, models, version=version.name, aliases=key_aliases(infos)
    )
    if fallback:
        # info, not warning: the report states it in the leaderboard's note
        logger.info(
            "no model in the store besides the k-mer floors; ranking the floors for demonstration"
        )
    entries = ranked + floors
    items = subset.items
    datasets = tuple(d.name for d in version.datasets)
    all_hashes = items["seq_sha256"].unique(maintain_order=True).to_list()
    for e in entries:  # every vector present, before any probe is fitted
        if e.key is not None:
            check_complete(store, e.key, all_hashes, version=version.name)
    labels: dict[str, NDArray[np.int64]] = {}
    preds: dict[str, NDArray[np.int64]] = {}
    probas: dict[str, NDArray[np.float64]] = {}
    fits: dict[tuple[str, str], ProbeFit] = {}
    item_ids: dict[str, list[str]] = {}
    probe_rows = []
    usual_n: dict[str, int] = {}
    for draw in version.datasets:
        part = items.filter(pl.col("dataset") == draw.name)
        train = part.filter(pl.col("split") == "train")
        test = part.filter(pl.col("split") == "test")
        y_train = train["label"].to_numpy().astype(np.int64)
        labels[draw.name] = test["label"].to_numpy().astype(np.int64)
        item_ids[draw.name] = test["item_id"].to_list()
        usual_n[draw.name] = draw.n_test if draw.n_test is not None else test.height
        test_hashes = test["seq_sha256"].to_list()
        rows, p_rows = [], []
        for e in entries:
            if e.key is None:
                rows.append(
                    np.full(test.height, majority_label(y_train), dtype=np.int64)
                )
                # the majority floor's probability: the train share of label 1
                p_rows.append(np.full(test.height, float(y_train.mean())))
                continue
            x_train = load_vectors(
                store, e.key, train["seq_sha256"].to_list(), version=version.name
            )
            fit = fit_probe(x_train, y_train, config=config)
            fits[(e.name, draw.name)] = fit
            pred, p1 = predict_with_proba(
                fit, store, e.key, test_hashes, version=version.name
            )
            rows.append(pred)
            p_rows.append(p1)
            probe_rows.append(
                {
                    "model": e.name,
                    "dataset": draw.name,
                    "C": fit.C_,
                    "cv_log_loss": float(fit.cv_log_loss_.min()),
                    "n_train": int(y_train.size),
                    "dim": int(x_train.shape[1]),
                }
            )
            logger.info("probed %s on %s: C=%g", e.name, draw.name, fit.C_)
        preds[draw.name] = np.stack(rows)
        probas[draw.name] = np.stack(p_rows)
    usual_n[MEAN] = sum(usual_n[d] for d in datasets)
    boot = bootstrap_scores(
        {d: labels[d] for d in datasets},
        {d: preds[d] for d in datasets},
        [e.name for e in entries],
        n_boot=n_boot,
        seed=seed,
    )
    results = results_frame(
        boot, entries, version=version.name, subset_id=subset.subset_id
    )
    return Evaluation(
        version=version.name,
        comparable=version.comparable,
        subset_id=subset.subset_id,
        ranked=tuple(ranked),
        floors=tuple(floors),
        fallback=fallback,
        datasets=datasets,
        item_ids=item_ids,
        labels=labels,
        predictions=preds,
        probes=pl.DataFrame(probe_rows)
        if probe_rows
        else pl.DataFrame(
            schema={"model": pl.Utf8, "dataset": pl.Utf8, "C": pl.Float64}
        ),
        bootstrap=boot,
        usual_n=usual_n,
        probe_config=config,
        seed=seed,
        results=results,
        probabilities=probas,
        fits=fits,
    )


def probe_errors(evaluation: Evaluation, model: str, dataset: str) -> pl.DataFrame:
    """The test items a model's probe got wrong on one dataset."""
    row = [e.name for e in evaluation.entries].index(evaluation.entry(model).name)
    pred = evaluation.predictions[dataset][row]
    truth = evaluation.labels[dataset]
    wrong = np.flatnonzero(pred != truth)
    return pl.DataFrame(
        {
            "item_id": [evaluation.item_ids[dataset][i] for i in wrong],
            "label": truth[wrong],
            "predicted": pred[wrong],
        }
    )


def errors_summary(errors: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """Per dataset: how many test items were misclassified, split by true label."""
    return pl.DataFrame(
        [
            {
                "dataset": name,
                "errors": frame.height,
                "true label 0 (false positives)": int((frame["label"] == 0).sum()),
                "true label 1 (false negatives)": int((frame["label"] == 1).sum()),
            }
            for name, frame in errors.items()
        ]
    )
