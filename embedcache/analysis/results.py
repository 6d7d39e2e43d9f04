"""The ``results.csv`` frame: one row per (model, dataset or mean, metric), and its writer.

The board's rows come from a :class:`~embedcache.analysis.bootstrap.BootstrapResult`
(:func:`results_frame`); the analyses add rows with new metrics and the same columns
(:func:`analysis_rows`). :func:`write_frame` writes any such frame atomically.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from embedcache.analysis.bootstrap import MEAN, METRICS

if TYPE_CHECKING:
    from collections.abc import Sequence

    from embedcache.analysis.bootstrap import BootstrapResult
    from embedcache.analysis.selection import ModelEntry

logger = logging.getLogger(__name__)

RESULT_COLUMNS = (
    "version",
    "subset_id",
    "model",
    "model_key",
    "dataset",
    "metric",
    "value",
    "ci_low",
    "ci_high",
    "n",
    "is_floor",
)


def _entry_meta(entries: Sequence[ModelEntry]) -> pl.DataFrame:
    """model, model_key, is_floor and the entries' order (``_order``) for a join."""
    return pl.DataFrame(
        {
            "model": [e.name for e in entries],
            "model_key": [e.model_key for e in entries],
            "is_floor": [e.is_floor for e in entries],
            "_order": list(range(len(entries))),
        }
    )


def results_frame(
    boot: BootstrapResult,
    entries: Sequence[ModelEntry],
    *,
    version: str,
    subset_id: str,
) -> pl.DataFrame:
    """The ``results.csv`` frame: one row per (model, dataset or mean, metric)."""
    return analysis_rows(
        boot.summary(),
        entries,
        version=version,
        subset_id=subset_id,
        datasets=boot.dataset_names,
        metrics=METRICS,
    )


def analysis_rows(
    summary: pl.DataFrame,
    entries: Sequence[ModelEntry],
    *,
    version: str,
    subset_id: str,
    datasets: Sequence[str],
    metrics: Sequence[str] | None = None,
) -> pl.DataFrame:
    """``results.csv`` rows of ``summary`` (columns model, dataset, metric, value,
    ci_low, ci_high, n; models named as in ``entries``), in the entries' order.

    With ``metrics``, then by dataset and by that metric order (the protocol's own
    rows); without, by metric name and then dataset (an analysis of an evaluation:
    :meth:`Evaluation.analysis_results` passes its own fields).
    """
    dataset_order = {d: i for i, d in enumerate((*datasets, MEAN))}
    frame = summary.join(_entry_meta(entries), on="model", how="left").with_columns(
        pl.lit(version).alias("version"),
        pl.lit(subset_id).alias("subset_id"),
        pl.col("dataset").replace_strict(dataset_order).alias("_d"),
        pl.col("n").cast(pl.Int64),
    )
    if metrics is None:
        frame = frame.sort(["_order", "metric", "_d"], maintain_order=True)
    else:
        order = {m: i for i, m in enumerate(metrics)}
        frame = frame.with_columns(pl.col("metric").replace_strict(order).alias("_m"))
        frame = frame.sort(["_order", "_d", "_m"])
    return frame.select(RESULT_COLUMNS)


def write_frame(
    frame: pl.DataFrame,
    path: Path | str,
    columns: Sequence[str],
    *,
    parquet: bool = False,
) -> Path:
    """Write ``frame``'s ``columns`` as CSV (or Parquet) atomically: a reader never
    sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        if parquet:
            frame.select(columns).write_parquet(tmp)
        else:
            frame.select(columns).write_csv(tmp)
        Path(tmp).replace(path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def write_results(results: pl.DataFrame, path: Path | str) -> Path:
    """Write ``results.csv`` atomically, with exactly :data:`RESULT_COLUMNS`."""
    path = write_frame(results, path, RESULT_COLUMNS)
    logger.info("wrote %d result rows to %s", results.height, path)
    return path
