"""Shared test helpers: evaluations built by hand, and a tiny version over a toy store.

:func:`make_evaluation` builds an :class:`~embedcache.analysis.evaluation.Evaluation`
from given predictions. :data:`TINY_VERSION` (a self-split of the bundled demo data),
:class:`DictStore` (an in-memory store) and :func:`fill_store` (planted vectors) give
the analysis and report tests a real :func:`~embedcache.analysis.evaluation.evaluate`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from embedcache.analysis.bootstrap import MEAN, bootstrap_scores
from embedcache.analysis.evaluation import Evaluation, evaluate
from embedcache.analysis.probe import ProbeConfig
from embedcache.analysis.results import results_frame
from embedcache.analysis.selection import ModelEntry
from embedcache.data.subsets import draw_version
from embedcache.data.versions import load_version
from embedcache.specs import ModelKey

if TYPE_CHECKING:
    from pathlib import Path

    from embedcache.data.subsets import Subset


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


TINY_VERSION = """
name = "tiny-v1"
description = "a tiny self-split over the bundled demo data, for tests"
comparable = false
seed = 7

[[datasets]]
name = "human_enhancers_cohn"
source = "demo"
test_split = "demo"
train_split = "demo"
n_test = 120
n_train = 80

[[datasets]]
name = "human_nontata_promoters"
source = "demo"
test_split = "demo"
train_split = "demo"
n_test = 90
n_train = 80
"""

# (model id, adapter, dim, signal): two "real" models and two k-mer floors
MODELS = [
    ("toy/strong", "hf-encoder", 12, 1.5),
    ("toy/weak", "hf-encoder", 12, 0.3),
    ("kmer-2", "kmer", 16, 0.5),
    ("kmer-3", "kmer", 64, 1.2),
]


def toy_key(model_id: str, adapter: str) -> ModelKey:
    """A key of a toy model (fixed revision) for the in-memory store."""
    return ModelKey(
        model_id=model_id,
        revision="sha256:" + "ab" * 8,
        adapter=adapter,
        adapter_version="1",
    )


class DictStore:
    """In-memory stand-in with the EmbeddingStore read interface."""

    def __init__(self):
        self.data = {}
        self.root = "memory"

    def keys(self):
        return list(self.data)

    def put(self, key, hashes, vectors, alias=None, kernels=None):
        self.data.setdefault(key, {}).update(zip(hashes, vectors, strict=True))

    def contains(self, key, hashes):
        table = self.data.get(key, {})
        return np.array([h in table for h in hashes], dtype=bool)

    def get(self, key, hashes):
        table = self.data.get(key, {})
        dim = len(next(iter(table.values()))) if table else 0
        out = np.full((len(hashes), dim), np.nan, np.float32)
        found = np.array([h in table for h in hashes], dtype=bool)
        for i, h in enumerate(hashes):
            if found[i]:
                out[i] = table[h]
        return out, found


def fill_store(store, items, models=MODELS, seed=0) -> None:
    """Planted vectors: column 0 carries each model's signal about the label."""
    rng = np.random.default_rng(seed)
    y = items["label"].to_numpy()
    for model_id, adapter, dim, signal in models:
        vectors = rng.normal(size=(items.height, dim)).astype(np.float32)
        vectors[:, 0] += signal * (2 * y - 1)
        store.put(toy_key(model_id, adapter), items["seq_sha256"].to_list(), vectors)


def draw_tiny(folder: Path) -> Subset:
    """Write tiny-v1 into ``folder`` and draw it."""
    path = folder / "tiny-v1.toml"
    path.write_text(TINY_VERSION)
    return draw_version(load_version(path))


def tiny_board(
    folder: Path, *, n_boot: int, seed: int = 0
) -> tuple[Subset, DictStore, Evaluation]:
    """tiny-v1 drawn, a filled toy store, and the board's evaluation of it."""
    subset = draw_tiny(folder)
    store = DictStore()
    fill_store(store, subset.items)
    return subset, store, evaluate(subset, store, n_boot=n_boot, seed=seed)
