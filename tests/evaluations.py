"""Build small :class:`~embedcache.analysis.evaluation.Evaluation` objects by hand for tests."""

from __future__ import annotations

import numpy as np
import polars as pl

from embedcache.analysis.bootstrap import MEAN, bootstrap_scores
from embedcache.analysis.evaluation import Evaluation
from embedcache.analysis.probe import ProbeConfig
from embedcache.analysis.results import results_frame
from embedcache.analysis.selection import ModelEntry
from embedcache.specs import ModelKey


def model_key(model_id: str, adapter: str = "hf-encoder") -> ModelKey:
    return ModelKey(
        model_id=model_id,
        revision="sha256:" + "cd" * 8,
        adapter=adapter,
        adapter_version="1",
    )


def make_evaluation(
    labels: dict[str, list[int]],
    preds: dict[str, list[list[int]]],
    ranked: list[str],
    floors: tuple[str, ...] = (),
    *,
    n_boot: int = 200,
    seed: int = 0,
) -> Evaluation:
    """An evaluation of given predictions: rows of ``preds`` follow ranked + floors."""
    entries = [ModelEntry(n, model_key(n), is_floor=False) for n in ranked]
    floor_entries = [ModelEntry(n, model_key(n, "kmer"), is_floor=True) for n in floors]
    names = [e.name for e in entries + floor_entries]
    y = {d: np.asarray(v, dtype=np.int64) for d, v in labels.items()}
    p = {d: np.asarray(v, dtype=np.int64) for d, v in preds.items()}
    boot = bootstrap_scores(y, p, names, n_boot=n_boot, seed=seed)
    usual = {d: len(v) for d, v in labels.items()}
    usual[MEAN] = sum(usual.values())
    return Evaluation(
        version="hand-v1",
        comparable=True,
        subset_id="0" * 16,
        ranked=tuple(entries),
        floors=tuple(floor_entries),
        fallback=False,
        datasets=tuple(labels),
        item_ids={
            d: [f"{d}:test:{i:06d}" for i in range(len(v))] for d, v in labels.items()
        },
        labels=y,
        predictions=p,
        probes=pl.DataFrame(),
        bootstrap=boot,
        usual_n=usual,
        probe_config=ProbeConfig(),
        seed=seed,
        results=results_frame(
            boot, entries + floor_entries, version="hand-v1", subset_id="0" * 16
        ),
    )
