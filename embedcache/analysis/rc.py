"""Reverse-complement robustness: each probe scored on the reverse complements of the test items.

A window read from the other strand is the same DNA, so a model's probe should
call it the same. For every model whose store key holds the reverse complements of
a version's test sequences (``embedcache embeddings --with-rc``), the probe fit on
the version's train embeddings (the board's own fit, not refit) predicts the
reverse complements: metric ``accuracy_rc``, bootstrapped as the protocol says
(same resamples and seed, ``n`` = test items). Beside it, the median and 5th
percentile over test items of the cosine between an item's vector and its reverse
complement's. A key embedded with ``--rc average`` is strand-symmetric by
construction: its cosine is reported as such, never as a trivial 1.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from embedcache.analysis.bootstrap import (
    MEAN,
    BootstrapResult,
    bootstrap_scores,
    percentile_ci,
)
from embedcache.analysis.vectors import load_vectors, predict_stored
from embedcache.hashing import normalise_sequence, reverse_complement, sequence_key

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from embedcache.analysis.evaluation import Evaluation
    from embedcache.analysis.vectors import VectorStore
    from embedcache.data.subsets import Subset

logger = logging.getLogger(__name__)

METRIC = "accuracy_rc"
SYMMETRIC = "strand-symmetric by construction (--rc average)"
SUMMARY_SCHEMA = {
    "model": pl.Utf8,
    "dataset": pl.Utf8,
    "metric": pl.Utf8,
    "value": pl.Float64,
    "ci_low": pl.Float64,
    "ci_high": pl.Float64,
    "n": pl.Int64,
}


def rc_hashes(seqs: list[str]) -> list[str]:
    """The store hashes of the reverse complements of ``seqs``."""
    return [sequence_key(reverse_complement(normalise_sequence(s))) for s in seqs]


def _cosines(a: NDArray[np.float32], b: NDArray[np.float32]) -> NDArray[np.float64]:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    num = (a64 * b64).sum(axis=1)
    den = np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1)
    # two zero vectors point the same way: cosine 1; one zero vector: 0
    same = (den == 0) & np.all(a64 == b64, axis=1)
    out = np.divide(num, den, out=np.zeros_like(num), where=den > 0)
    out[same] = 1.0
    return out


@dataclass(frozen=True)
class RcScores:
    """accuracy_rc of the models with stored reverse complements, and their cosines."""

    models: tuple[str, ...]  # scored on reverse complements, in board order
    missing: tuple[str, ...]  # no reverse complements stored (not embedded --with-rc)
    bootstrap: BootstrapResult | None
    cosine: pl.DataFrame  # model, rc_mode, cos_median, cos_p5, n, note

    def summary(self) -> pl.DataFrame:
        """model, dataset, metric (accuracy_rc), value, ci_low, ci_high, n."""
        if self.bootstrap is None:
            return pl.DataFrame(schema=SUMMARY_SCHEMA)
        return (
            self.bootstrap.summary()
            .filter(pl.col("metric") == "accuracy")
            .with_columns(pl.lit(METRIC).alias("metric"))
        )

    def against_accuracy(self, evaluation: Evaluation) -> pl.DataFrame:
        """Per model: mean accuracy, accuracy_rc [CI], and whether that CI excludes it."""
        rows = []
        if self.bootstrap is None:
            return pl.DataFrame()
        boot = evaluation.bootstrap
        rc_point = self.bootstrap.point("accuracy", MEAN)
        low, high = percentile_ci(
            self.bootstrap.samples("accuracy", MEAN), level=self.bootstrap.level
        )
        for i, model in enumerate(self.models):
            acc = float(boot.point("accuracy", MEAN)[boot.models.index(model)])
            rows.append(
                {
                    "model": model,
                    "accuracy": acc,
                    "accuracy_rc": float(rc_point[i]),
                    "ci_low": float(low[i]),
                    "ci_high": float(high[i]),
                    "excludes_accuracy": not (low[i] <= acc <= high[i]),
                }
            )
        return pl.DataFrame(rows)


def rc_scores(subset: Subset, store: VectorStore, evaluation: Evaluation) -> RcScores:
    """Score every model of ``evaluation`` on the reverse complements of its test items.

    Models whose key lacks any reverse complement are listed in ``missing`` and not
    scored. The majority floor ignores the sequence: its predictions stand as they are.
    """
    version = subset.version.name
    items = subset.items.filter(pl.col("split") == "test")
    tests = {
        d: items.filter(pl.col("dataset") == d)["seq"].to_list()
        for d in evaluation.datasets
    }
    fwd = {
        d: items.filter(pl.col("dataset") == d)["seq_sha256"].to_list()
        for d in evaluation.datasets
    }
    rev = {d: rc_hashes(s) for d, s in tests.items()}
    names, missing, cos_rows = [], [], []
    preds: dict[str, list[NDArray[np.int64]]] = {d: [] for d in evaluation.datasets}
    for i, e in enumerate(evaluation.entries):
        if e.key is None:
            names.append(e.name)
            for d in evaluation.datasets:
                preds[d].append(evaluation.predictions[d][i])
            continue
        if not all(store.contains(e.key, rev[d]).all() for d in evaluation.datasets):
            missing.append(e.name)
            continue
        names.append(e.name)
        cos = []
        for d in evaluation.datasets:
            fit = evaluation.fits[(e.name, d)]
            preds[d].append(predict_stored(fit, store, e.key, rev[d], version=version))
            a = load_vectors(store, e.key, fwd[d], version=version)
            b = load_vectors(store, e.key, rev[d], version=version)
            cos.append(_cosines(a, b))
        every = np.concatenate(cos)
        symmetric = e.key.rc_mode == "average"
        cos_rows.append(
            {
                "model": e.name,
                "rc_mode": e.key.rc_mode,
                "cos_median": None if symmetric else float(np.median(every)),
                "cos_p5": None if symmetric else float(np.percentile(every, 5)),
                "n": int(every.size),
                "note": SYMMETRIC if symmetric else "",
            }
        )
    if missing:
        logger.info(
            "no reverse complements stored for %s; embed with --with-rc for accuracy_rc",
            ", ".join(missing),
        )
    has_vectors = any(e.key is not None and e.name in names for e in evaluation.entries)
    boot = None
    if has_vectors:
        boot = bootstrap_scores(
            {d: evaluation.labels[d] for d in evaluation.datasets},
            {d: np.stack(preds[d]) for d in evaluation.datasets},
            names,
            n_boot=evaluation.bootstrap.n_boot,
            seed=evaluation.seed,
            level=evaluation.bootstrap.level,
        )
    else:
        names = []
    cosine = pl.DataFrame(
        cos_rows,
        schema={
            "model": pl.Utf8,
            "rc_mode": pl.Utf8,
            "cos_median": pl.Float64,
            "cos_p5": pl.Float64,
            "n": pl.Int64,
            "note": pl.Utf8,
        },
    )
    return RcScores(tuple(names), tuple(missing), boot, cosine)
