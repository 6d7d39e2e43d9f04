"""Pretraining gain: a model against its random-init twin, paired on the same resamples.

A twin (``--random-init SEED``) has the trained model's architecture and embedding
options with seeded random weights; its key differs only in the revision
(``random-init:<seed>``) and the config digest it records. The gain is the trained
model's accuracy minus the twin's, with a paired bootstrap interval: both are scored
on the same test items and the same resamples (the evaluation's). A twin whose
trained model is not in the evaluation is still shown, as a control.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

import polars as pl

from embedcache.analysis.bootstrap import MEAN, percentile_ci
from embedcache.analysis.selection import is_random_init

if TYPE_CHECKING:
    from embedcache.analysis.evaluation import Evaluation
    from embedcache.analysis.selection import ModelEntry
    from embedcache.specs import ModelKey

logger = logging.getLogger(__name__)

GAIN_COLUMNS = {
    "model": pl.Utf8,
    "twin": pl.Utf8,
    "seed": pl.Utf8,
    "dataset": pl.Utf8,
    "accuracy": pl.Float64,
    "twin_accuracy": pl.Float64,
    "gain": pl.Float64,
    "ci_low": pl.Float64,
    "ci_high": pl.Float64,
    "n": pl.Int64,
}


def _trained_form(key: ModelKey) -> ModelKey:
    """The twin's key with the parts that differ from its trained model blanked."""
    options = tuple((k, v) for k, v in key.options if k != "config")
    return dataclasses.replace(key, revision="-", options=options)


def find_twins(
    entries: tuple[ModelEntry, ...] | list[ModelEntry],
) -> list[tuple[ModelEntry | None, ModelEntry]]:
    """(trained entry or None, twin entry) for every random-init twin among ``entries``.

    A trained entry matches when its key equals the twin's in every field but the
    revision and the config digest. Several matches (e.g. two local directories of
    one family, all model id ``local``) pair none, said in the log.
    """
    pairs: list[tuple[ModelEntry | None, ModelEntry]] = []
    keyed = [e for e in entries if e.key is not None]
    for twin in keyed:
        if not is_random_init(twin.key):
            continue
        form = _trained_form(twin.key)
        matches = [
            e
            for e in keyed
            if not is_random_init(e.key) and _trained_form(e.key) == form
        ]
        if len(matches) > 1:
            logger.warning(
                "%s: %d trained models match its architecture key; not paired",
                twin.name,
                len(matches),
            )
        pairs.append((matches[0] if len(matches) == 1 else None, twin))
    return pairs


def pretraining_gain(evaluation: Evaluation) -> pl.DataFrame:
    """Per twin and dataset (and the mean): accuracies, gain and its paired 95% CI.

    ``model`` and the gain columns are null where the twin's trained model is not in
    the evaluation (the twin is then shown as a control alone).
    """
    boot = evaluation.bootstrap
    rows = []
    for trained, twin in find_twins(evaluation.entries):
        seed = twin.key.revision.split(":", 1)[1]
        t = boot.models.index(twin.name)
        for name in (*evaluation.datasets, MEAN):
            point = boot.point("accuracy", name)
            row: dict[str, object] = {
                "model": None,
                "twin": twin.name,
                "seed": seed,
                "dataset": name,
                "accuracy": None,
                "twin_accuracy": float(point[t]),
                "gain": None,
                "ci_low": None,
                "ci_high": None,
                "n": boot.n(name),
            }
            if trained is not None:
                m = boot.models.index(trained.name)
                samples = boot.samples("accuracy", name)
                low, high = percentile_ci(
                    samples[:, m] - samples[:, t], level=boot.level
                )
                row.update(
                    model=trained.name,
                    accuracy=float(point[m]),
                    gain=float(point[m] - point[t]),
                    ci_low=float(low),
                    ci_high=float(high),
                )
            rows.append(row)
    return pl.DataFrame(rows, schema=GAIN_COLUMNS)
