"""Label-efficiency curves: probe accuracy as the number of labelled train items grows.

For each n_train in :data:`N_TRAIN_GRID`, each dataset's train subset is drawn from
the version's own train items by the protocol's rule (largest-remainder quotas over
their label counts, then the seed-hash rank with the version's seed, via
:func:`embedcache.data.subsets.draw_stratified`). With two labels the quotas never shrink
as n grows and the rank within a label is fixed, so every subset is a prefix of the
next: the subsets are nested (checked, not assumed). The probe is the protocol's
(fixed C grid, stratified CV on log-loss inside train), scored on the full test set
with the protocol's bootstrap. No new embedding is needed.

Small n: stratified k-fold CV needs at least k items of each label. When the
smallest label count m of a subset is below the protocol's 5 folds, the probe uses m
folds (m >= 2) and the fold count is recorded (:attr:`Curves.fits`); with m < 2 no
probe can be cross-validated, and that (dataset, n_train) point is left out, and so
is the mean at that n_train. n_train equal to the full train size reproduces the
leaderboard's probe exactly.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from embedcache.analysis.bootstrap import MEAN, bootstrap_scores
from embedcache.analysis.probe import ProbeConfig, fit_probe, majority_label
from embedcache.analysis.results import write_frame
from embedcache.analysis.vectors import load_vectors, vector_chunks
from embedcache.data.subsets import draw_stratified
from embedcache.errors import AnalysisInputError

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from embedcache.analysis.evaluation import Evaluation
    from embedcache.analysis.selection import ModelEntry
    from embedcache.analysis.vectors import VectorStore
    from embedcache.data.subsets import Subset

logger = logging.getLogger(__name__)

N_TRAIN_GRID: tuple[int, ...] = (10, 20, 50, 100, 200, 500)
MIN_FOLDS = 2
CURVE_COLUMNS = (
    "version",
    "subset_id",
    "model",
    "model_key",
    "dataset",
    "n_train",
    "metric",
    "value",
    "ci_low",
    "ci_high",
    "n",
)


def nested_train_subsets(
    train: pl.DataFrame, sizes: Sequence[int], *, seed: int, what: str = "train"
) -> dict[int, pl.DataFrame]:
    """Draw each size from ``train`` (columns item_id, label, ...) by the protocol's rule.

    Sizes larger than ``train`` are skipped. Raises unless every smaller subset lies
    inside every larger one.
    """
    out: dict[int, pl.DataFrame] = {}
    for n in sorted(set(sizes)):
        if n > train.height:
            logger.info(
                "%s: n_train=%d exceeds its %d items; skipped", what, n, train.height
            )
            continue
        out[n] = draw_stratified(train, n, seed=seed, what=what)
    previous: set[str] = set()
    for n, drawn in out.items():
        ids = set(drawn["item_id"].to_list())
        if not previous <= ids:
            msg = (
                f"{what}: the n_train={n} subset does not contain the smaller ones; "
                "largest-remainder quotas shrank for a label (only possible with 3+ labels)"
            )
            raise AnalysisInputError(msg)
        previous = ids
    return out


def curve_probe_config(
    labels: NDArray[np.int64], config: ProbeConfig
) -> ProbeConfig | None:
    """The probe config for a small train subset: fewer folds when a label is rare.

    None when a label has fewer than :data:`MIN_FOLDS` items (no CV possible).
    """
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=2)
    smallest = int(counts.min())
    if smallest >= config.n_folds:
        return config
    if smallest < MIN_FOLDS:
        return None
    return dataclasses.replace(config, n_folds=smallest)


@dataclass(frozen=True)
class Curves:
    """Label-efficiency results: ``frame`` is curves.csv, ``fits`` how each probe was fit."""

    frame: pl.DataFrame  # CURVE_COLUMNS
    fits: pl.DataFrame  # model, dataset, n_train, n_label_0, n_label_1, n_folds, C


def label_efficiency(
    subset: Subset,
    store: VectorStore,
    entries: Sequence[ModelEntry],
    *,
    sizes: Sequence[int] = N_TRAIN_GRID,
    n_boot: int = 1000,
    seed: int = 0,
    probe_config: ProbeConfig | None = None,
    board: Evaluation | None = None,
) -> Curves:
    """Accuracy of every entry at every n_train, on each dataset's full test set.

    ``entries`` are the evaluation's (:attr:`embedcache.analysis.evaluation.Evaluation.entries`):
    models read from ``store``, and the majority floor (key None), whose prediction is
    the subset's most frequent label. The bootstrap uses the protocol's per-dataset
    resamples, so every point of every curve sees the same resamples.

    ``board``: the evaluation of the same subset with the same probe config; at
    n_train = the whole train, whose subset is the board's own train, its
    predictions and chosen C are taken instead of fitting the same probe again.
    """
    config = probe_config or ProbeConfig()
    if board is not None and (
        board.subset_id != subset.subset_id or board.probe_config != config
    ):
        msg = (
            f"the board evaluation scored subset {board.subset_id} with "
            f"{board.probe_config}; the curves need subset {subset.subset_id} with "
            f"{config}. Pass the evaluation of the same subset and probe config."
        )
        raise AnalysisInputError(msg)
    version = subset.version
    names = [e.name for e in entries]
    labels: dict[str, NDArray[np.int64]] = {}
    preds: dict[int, dict[str, NDArray[np.int64]]] = {}
    fit_rows = []
    for draw in version.datasets:
        part = subset.items.filter(pl.col("dataset") == draw.name)
        train = part.filter(pl.col("split") == "train")
        test = part.filter(pl.col("split") == "test")
        labels[draw.name] = test["label"].to_numpy().astype(np.int64)
        nested = nested_train_subsets(
            train, sizes, seed=version.seed, what=f"{draw.name} train"
        )
        test_hashes = test["seq_sha256"].to_list()
        rows: dict[int, list[NDArray[np.int64]]] = {n: [] for n in nested}
        usable = dict.fromkeys(nested, True)
        row_of = {item: i for i, item in enumerate(train["item_id"].to_list())}
        for e in entries:
            x_train = None
            x_test = None
            for n, drawn in nested.items():
                y = drawn["label"].to_numpy().astype(np.int64)
                cfg = curve_probe_config(y, config)
                if board is not None and n == train.height and e.key is not None:
                    row = [x.name for x in board.entries].index(e.name)
                    rows[n].append(board.predictions[draw.name][row])
                    chosen = board.probes.filter(
                        (pl.col("model") == e.name) & (pl.col("dataset") == draw.name)
                    )
                    c = float(chosen["C"][0])
                    fit_rows.append(
                        _fit_row(e.name, draw.name, n, y, config.n_folds, c)
                    )
                    continue
                if e.key is None:
                    rows[n].append(
                        np.full(test.height, majority_label(y), dtype=np.int64)
                    )
                    continue
                if cfg is None:
                    usable[n] = False
                    continue
                if x_train is None:
                    x_train = load_vectors(
                        store,
                        e.key,
                        train["seq_sha256"].to_list(),
                        version=version.name,
                    )
                if x_test is None:
                    x_test = np.concatenate(
                        list(
                            vector_chunks(
                                store, e.key, test_hashes, version=version.name
                            )
                        )
                    )
                idx = [row_of[i] for i in drawn["item_id"].to_list()]
                fit = fit_probe(x_train[idx], y, config=cfg)
                rows[n].append(fit.predict(x_test))
                fit_rows.append(_fit_row(e.name, draw.name, n, y, cfg.n_folds, fit.C_))
            logger.info("curve of %s on %s: %d points", e.name, draw.name, len(nested))
        for n, ok in usable.items():
            if ok:
                preds.setdefault(n, {})[draw.name] = np.stack(rows[n])
            else:
                logger.warning(
                    "%s: n_train=%d leaves a label with fewer than %d items; point left out",
                    draw.name,
                    n,
                    MIN_FOLDS,
                )
    frames = []
    all_datasets = set(version.dataset_names)
    for n in sorted(preds):
        per = preds[n]
        summary = bootstrap_scores(
            {d: labels[d] for d in per}, per, names, n_boot=n_boot, seed=seed
        ).summary()
        summary = summary.filter(pl.col("metric") == "accuracy")
        if set(per) != all_datasets:  # the mean needs every dataset
            summary = summary.filter(pl.col("dataset") != MEAN)
        frames.append(summary.with_columns(pl.lit(n).alias("n_train")))
    keys = {e.name: e.model_key for e in entries}
    model_order = {name: i for i, name in enumerate(names)}
    dataset_order = {d: i for i, d in enumerate((*version.dataset_names, MEAN))}
    frame = (
        pl.concat(frames)
        .with_columns(
            pl.lit(version.name).alias("version"),
            pl.lit(subset.subset_id).alias("subset_id"),
            pl.col("model").replace_strict(keys).alias("model_key"),
            pl.col("n").cast(pl.Int64),
            pl.col("n_train").cast(pl.Int64),
            pl.col("model").replace_strict(model_order).alias("_m"),
            pl.col("dataset").replace_strict(dataset_order).alias("_d"),
        )
        .sort(["_m", "_d", "n_train"])
        .select(CURVE_COLUMNS)
        if frames
        else pl.DataFrame(schema=dict.fromkeys(CURVE_COLUMNS, pl.Utf8))
    )
    return Curves(frame, pl.DataFrame(fit_rows))


def _fit_row(
    model: str, dataset: str, n: int, y: NDArray[np.int64], n_folds: int, c: float
) -> dict[str, object]:
    """One row of the curves' probe fits: the label counts of ``y`` and the C chosen."""
    counts = np.bincount(y, minlength=2)
    return {
        "model": model,
        "dataset": dataset,
        "n_train": n,
        "n_label_0": int(counts[0]),
        "n_label_1": int(counts[1]),
        "n_folds": n_folds,
        "C": c,
    }


def write_curves(frame: pl.DataFrame, path: Path | str) -> Path:
    """Write ``curves.csv`` atomically, with exactly :data:`CURVE_COLUMNS`."""
    path = write_frame(frame, path, CURVE_COLUMNS)
    logger.info("wrote %d curve rows to %s", frame.height, path)
    return path
