"""Layer sweep: the probe on every stored layer of a model, and the layer to pick.

A sweep (``--layers all`` or ``--layers 2,6,12``) stores each layer's mean-pooled
vector under its own key, identical but for ``layer``. For every model with more
than one stored layer, each layer gets the protocol's probe per dataset; its test
accuracy is reported with the protocol's bootstrap CI, and the layer a user should
pick is chosen by the probe's own cross-validated log-loss inside train (the mean
over datasets of each dataset's best CV log-loss), never by test accuracy. The
headline board stays the last layer (-1), whose numbers here equal the board's.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from embedcache.analysis.bootstrap import MEAN, bootstrap_scores
from embedcache.analysis.probe import ProbeConfig, fit_probe
from embedcache.analysis.selection import key_of
from embedcache.analysis.vectors import load_vectors, predict_stored

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from embedcache.analysis.vectors import VectorStore
    from embedcache.data.subsets import Subset
    from embedcache.specs import ModelKey

logger = logging.getLogger(__name__)

SWEEP_COLUMNS = (
    "model",
    "layer",
    "dataset",
    "accuracy",
    "ci_low",
    "ci_high",
    "n",
    "cv_log_loss",
    "C",
    "chosen",
)


def sweep_groups(keys: Sequence[ModelKey]) -> dict[ModelKey, list[ModelKey]]:
    """Keys that differ only in ``layer``, grouped under their last-layer form.

    Only groups with two or more layers are a sweep; layers are sorted with -1 first.
    """
    groups: dict[ModelKey, list[ModelKey]] = {}
    for key in keys:
        groups.setdefault(dataclasses.replace(key, layer=-1), []).append(key)
    return {
        base: sorted(members, key=lambda k: (k.layer != -1, k.layer))
        for base, members in groups.items()
        if len(members) > 1
    }


def layer_label(layer: int) -> str:
    return "last (-1)" if layer == -1 else str(layer)


@dataclass(frozen=True)
class LayerSweeps:
    """Every sweep: per (model, layer, dataset or mean) accuracy, CI and CV log-loss."""

    frame: pl.DataFrame  # SWEEP_COLUMNS; "chosen" marks the CV pick per model/dataset

    def chosen(self) -> pl.DataFrame:
        """model, dataset (each and mean), the chosen layer and its CV log-loss."""
        return self.frame.filter(pl.col("chosen")).select(
            "model", "dataset", "layer", "cv_log_loss", "accuracy"
        )


def choose_layer(cv_log_loss: dict[int, float]) -> int:
    """The layer with the lowest CV log-loss; ties go to the last layer, then the lower."""
    return min(cv_log_loss, key=lambda layer: (cv_log_loss[layer], layer != -1, layer))


def layer_sweeps(
    subset: Subset,
    store: VectorStore,
    *,
    model_name: dict[ModelKey, str] | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    probe_config: ProbeConfig | None = None,
) -> LayerSweeps:
    """Probe every layer of every swept model in ``store`` on ``subset``.

    ``model_name`` maps a last-layer key to its display name (the board's); others
    are named by model id.
    """
    config = probe_config or ProbeConfig()
    infos = store.keys()
    keys = [key_of(info) for info in infos]
    groups = sweep_groups(keys)
    version = subset.version
    rows = []
    for base, members in groups.items():
        name = (model_name or {}).get(base, base.model_id)
        labels: dict[str, NDArray[np.int64]] = {}
        preds: dict[str, NDArray[np.int64]] = {}
        losses: dict[str, dict[int, float]] = {}
        chosen_c: dict[tuple[str, int], float] = {}
        for draw in version.datasets:
            part = subset.items.filter(pl.col("dataset") == draw.name)
            train = part.filter(pl.col("split") == "train")
            test = part.filter(pl.col("split") == "test")
            y_train = train["label"].to_numpy().astype(np.int64)
            labels[draw.name] = test["label"].to_numpy().astype(np.int64)
            test_hashes = test["seq_sha256"].to_list()
            layer_preds = []
            losses[draw.name] = {}
            for key in members:
                x_train = load_vectors(
                    store, key, train["seq_sha256"].to_list(), version=version.name
                )
                fit = fit_probe(x_train, y_train, config=config)
                losses[draw.name][key.layer] = float(fit.cv_log_loss_.min())
                chosen_c[(draw.name, key.layer)] = fit.C_
                layer_preds.append(
                    predict_stored(fit, store, key, test_hashes, version=version.name)
                )
            preds[draw.name] = np.stack(layer_preds)
        layer_ids = [k.layer for k in members]
        boot = bootstrap_scores(
            labels, preds, [str(x) for x in layer_ids], n_boot=n_boot, seed=seed
        )
        summary = boot.summary().filter(pl.col("metric") == "accuracy")
        losses[MEAN] = {
            layer: float(np.mean([losses[d][layer] for d in labels]))
            for layer in layer_ids
        }
        picks = {d: choose_layer(losses[d]) for d in losses}
        for r in summary.iter_rows(named=True):
            layer = int(r["model"])
            d = r["dataset"]
            rows.append(
                {
                    "model": name,
                    "layer": layer,
                    "dataset": d,
                    "accuracy": r["value"],
                    "ci_low": r["ci_low"],
                    "ci_high": r["ci_high"],
                    "n": r["n"],
                    "cv_log_loss": losses[d][layer],
                    "C": chosen_c.get((d, layer)),
                    "chosen": picks[d] == layer,
                }
            )
        logger.info(
            "layer sweep of %s: %d layers; CV log-loss picks layer %s",
            name,
            len(layer_ids),
            picks[MEAN],
        )
    schema = {
        "model": pl.Utf8,
        "layer": pl.Int64,
        "dataset": pl.Utf8,
        "accuracy": pl.Float64,
        "ci_low": pl.Float64,
        "ci_high": pl.Float64,
        "n": pl.Int64,
        "cv_log_loss": pl.Float64,
        "C": pl.Float64,
        "chosen": pl.Boolean,
    }
    return LayerSweeps(pl.DataFrame(rows, schema=schema).select(SWEEP_COLUMNS))
