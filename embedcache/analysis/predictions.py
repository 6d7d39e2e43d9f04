"""Per-item predictions of every model, their pairwise agreement, and the items all get wrong.

:func:`predictions_frame` is ``predictions.parquet``: one row per (model, test item)
with the probe's probability of label 1, its label and whether the item is clean
(no exact, reverse-complement or near duplicate in the drawn train, as
``accuracy_clean`` uses). :func:`agreement` compares two models' predictions on the
same items (share agreeing and Cohen's kappa); :func:`always_wrong` lists the items
every ranked model misclassifies.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from embedcache.analysis.results import write_frame

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

    from embedcache.analysis.evaluation import Evaluation
    from embedcache.analysis.leakage import DatasetAudit

logger = logging.getLogger(__name__)

PREDICTION_COLUMNS = (
    "version",
    "subset_id",
    "model",
    "model_key",
    "item_id",
    "dataset",
    "label",
    "p_label1",
    "predicted",
    "correct",
    "clean",
)


def predictions_frame(
    evaluation: Evaluation, audits: Mapping[str, DatasetAudit]
) -> pl.DataFrame:
    """One row per (model, test item), models in board order, items in test order."""
    parts = []
    for d in evaluation.datasets:
        audit = audits[d]
        if list(audit.item_ids) != evaluation.item_ids[d]:
            msg = f"{d}: the leakage audit's items are not the evaluation's test items"
            raise ValueError(msg)
        clean = np.asarray(audit.clean, dtype=bool)
        labels = evaluation.labels[d]
        proba = evaluation.probabilities.get(d)
        for i, e in enumerate(evaluation.entries):
            pred = evaluation.predictions[d][i]
            parts.append(
                pl.DataFrame(
                    {
                        "model": e.name,
                        "model_key": e.model_key,
                        "item_id": evaluation.item_ids[d],
                        "dataset": d,
                        "label": labels,
                        "p_label1": proba[i] if proba is not None else np.nan,
                        "predicted": pred,
                        "correct": pred == labels,
                        "clean": clean,
                    },
                    schema_overrides={"label": pl.Int64, "predicted": pl.Int64},
                )
            )
    frame = pl.concat(parts).with_columns(
        pl.lit(evaluation.version).alias("version"),
        pl.lit(evaluation.subset_id).alias("subset_id"),
    )
    order = {e.name: i for i, e in enumerate(evaluation.entries)}
    return (
        frame.with_columns(pl.col("model").replace_strict(order).alias("_o"))
        .sort("_o", maintain_order=True)
        .select(PREDICTION_COLUMNS)
    )


def cohen_kappa(a: ArrayLike, b: ArrayLike) -> float:
    """Cohen's kappa of two raters' labels: (p_o - p_e) / (1 - p_e).

    p_o is the share of items on which they agree, p_e the agreement expected from
    each rater's label shares alone. When p_e is 1 (both always say the same single
    label) kappa is undefined: NaN.
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.size == 0:
        msg = f"kappa needs two non-empty label vectors of one length, got {a.shape} and {b.shape}"
        raise ValueError(msg)
    p_o = float(np.mean(a == b))
    labels = np.union1d(a, b)
    p_e = float(sum(np.mean(a == k) * np.mean(b == k) for k in labels))
    if np.isclose(p_e, 1.0):
        return float("nan")
    return (p_o - p_e) / (1.0 - p_e)


def agreement(
    evaluation: Evaluation, dataset: str, *, models: Sequence[str] | None = None
) -> pl.DataFrame:
    """Every pair of models on one dataset: model_a, model_b, n, agreement, kappa."""
    names = [e.name for e in evaluation.entries]
    chosen = list(models) if models is not None else names
    preds = evaluation.predictions[dataset]
    rows = []
    for i, a in enumerate(chosen):
        for b in chosen[i + 1 :]:
            pa, pb = preds[names.index(a)], preds[names.index(b)]
            rows.append(
                {
                    "model_a": a,
                    "model_b": b,
                    "n": int(pa.size),
                    "agreement": float(np.mean(pa == pb)),
                    "kappa": cohen_kappa(pa, pb),
                }
            )
    return pl.DataFrame(
        rows,
        schema={
            "model_a": pl.Utf8,
            "model_b": pl.Utf8,
            "n": pl.Int64,
            "agreement": pl.Float64,
            "kappa": pl.Float64,
        },
    )


def always_wrong(evaluation: Evaluation, dataset: str) -> pl.DataFrame:
    """The test items of one dataset that every ranked model misclassifies.

    Columns item_id and label, in test order; empty without a ranked model.
    """
    n_ranked = len(evaluation.ranked)
    labels = evaluation.labels[dataset]
    if n_ranked == 0:
        wrong = np.zeros(labels.size, dtype=bool)
    else:
        preds = evaluation.predictions[dataset][:n_ranked]  # ranked come first
        wrong = (preds != labels[None, :]).all(axis=0)
    idx = np.flatnonzero(wrong)
    return pl.DataFrame(
        {
            "item_id": [evaluation.item_ids[dataset][i] for i in idx],
            "label": labels[idx],
        },
        schema={"item_id": pl.Utf8, "label": pl.Int64},
    )


def write_predictions(frame: pl.DataFrame, path: Path | str) -> Path:
    """Write ``predictions.parquet`` atomically (a reader never sees half a file)."""
    path = write_frame(frame, path, PREDICTION_COLUMNS, parquet=True)
    logger.info("wrote %d predictions to %s", frame.height, path)
    return path
