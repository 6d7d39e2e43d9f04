"""Score a drawn subset: store vectors -> probes -> bootstrap -> the results frame.

Ties a :class:`~embedcache.data.subsets.Subset`, an embedding store and model keys into
per-model predictions, bootstrap intervals, ranks and the ``results.csv`` frame.

Floors (shown unranked): the majority class of each dataset's train items, the
``kmer-K`` spectrum probes and the ``gc`` (GC fraction) probe, read from the store
like any model (keys whose adapter is ``"kmer"`` or ``"gc"``). The best K is the one
with the highest mean test accuracy: a generous floor, so a model has to beat the
strongest k-mer probe, not a chosen one. Random-init twins (revision
``random-init:<seed>``) are controls: shown unranked with the floors (is_floor true).
Only last-layer keys (layer -1) enter the board; a layer sweep's other keys are read
by :mod:`embedcache.analysis.layers`.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import polars as pl

from embedcache.analysis.probe import ProbeConfig, fit_probe, majority_label
from embedcache.analysis.stats import (
    MEAN,
    METRICS,
    N_BOOT,
    BootstrapResult,
    bootstrap_scores,
    paired_differences,
    percentile_ci,
    significance_ranks,
)
from embedcache.errors import MissingEmbeddingsError
from embedcache.models import LOCAL_MODEL_ID

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from embedcache.data.subsets import Subset
    from embedcache.specs import ModelKey

logger = logging.getLogger(__name__)

FLOOR_ADAPTER = "kmer"
FLOOR_ADAPTERS = (FLOOR_ADAPTER, "gc")  # built-in floors: scored like models, unranked
MAJORITY = "majority"
MAJORITY_KEY = "builtin:majority-class"
_CHUNK = 4096  # test vectors read and predicted per step
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


class VectorStore(Protocol):
    """What scoring needs from :class:`embedcache.store.EmbeddingStore`."""

    def keys(self) -> Sequence[Any]: ...

    def get(
        self, key: ModelKey, hashes: Sequence[str]
    ) -> tuple[NDArray[np.float32], NDArray[np.bool_]]: ...

    def contains(self, key: ModelKey, hashes: Sequence[str]) -> NDArray[np.bool_]: ...


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One scored row group: a store key (or the majority floor) and its display name."""

    name: str
    key: ModelKey | None
    is_floor: bool

    @property
    def model_key(self) -> str:
        return self.key.digest if self.key is not None else MAJORITY_KEY


def _key_of(info: object) -> ModelKey:
    # store.keys() returns KeyInfo records; tests may pass bare ModelKeys
    return getattr(info, "key", info)


def key_aliases(infos: Sequence[object]) -> dict[str, tuple[str, ...]]:
    """Digest -> the display aliases the store recorded for it (local models' folder
    names); bare ModelKeys have none."""
    return {_key_of(i).digest: tuple(getattr(i, "aliases", ())) for i in infos}


RANDOM_INIT_PREFIX = "random-init:"


def is_random_init(key: ModelKey) -> bool:
    """A random-init twin: the architecture with seeded random weights (a control)."""
    return key.revision.startswith(RANDOM_INIT_PREFIX)


def _is_floor_key(key: ModelKey) -> bool:
    # built-in floors and random-init controls are shown unranked, beside the models
    return key.adapter in FLOOR_ADAPTERS or is_random_init(key)


def display_id(key: ModelKey, aliases: Sequence[str] = ()) -> str:
    """The model id, or for a local model (whose id is only ``local``) its first
    recorded folder name, else ``local@<digest>``."""
    if key.model_id != LOCAL_MODEL_ID:
        return key.model_id
    if aliases:
        return aliases[0]
    return f"{LOCAL_MODEL_ID}@{key.revision.removeprefix('sha256:')[:12]}"


def _base_name(key: ModelKey, aliases: Sequence[str] = ()) -> str:
    name = display_id(key, aliases)
    if is_random_init(key):
        seed = key.revision.removeprefix(RANDOM_INIT_PREFIX)
        return f"{name} (random init {seed}, control)"
    return name


def _names(
    keys: Sequence[ModelKey], aliases: Mapping[str, Sequence[str]] | None = None
) -> list[str]:
    """Display ids (random-init twins marked), plus [digest] where two keys share one."""
    aliases = aliases or {}
    bases = [_base_name(k, aliases.get(k.digest, ())) for k in keys]
    return [
        f"{base} [{k.digest[:8]}]" if bases.count(base) > 1 else base
        for base, k in zip(bases, keys, strict=True)
    ]


def match_keys(
    keys: Sequence[ModelKey],
    name: str,
    *,
    aliases: Mapping[str, Sequence[str]] | None = None,
) -> list[ModelKey]:
    """The keys ``name`` names: a model id, a local model's alias (folder name), a
    key's ``short()`` form, or a digest prefix.

    A digest prefix needs 8+ hex digits. Several keys can share a model id (other
    options, dtype or RC mode); the caller decides whether that is allowed.
    """
    aliases = aliases or {}
    return [
        k
        for k in keys
        if name in {k.model_id, k.short(), *aliases.get(k.digest, ())}
        or (len(name) >= 8 and k.digest.startswith(name))
    ]


def select_models(
    keys: Sequence[ModelKey],
    models: Sequence[str] = (),
    *,
    version: str = "VERSION",
    aliases: Mapping[str, Sequence[str]] | None = None,
) -> tuple[list[ModelEntry], list[ModelEntry], bool]:
    """Split the store's keys into ranked models and floors.

    Parameters
    ----------
    keys
        Every key in the store.
    models
        Model ids (or key digests, 8+ hex digits) to rank; empty means every
        non-floor key. Naming a ``kmer-K`` key ranks it too.
    aliases
        Digest -> display aliases (:func:`key_aliases`): local models are shown and
        matched by their folder names.

    Returns
    -------
    ranked, floors, fallback
        ``fallback`` is True when ``models`` was empty and the store holds no
        non-floor key, so the k-mer floors are ranked for demonstration.

    Raises
    ------
    MissingEmbeddingsError
        A requested model has no key in the store.
    """
    # the board scores the last layer (the protocol's); other layers of a sweep are
    # read by the layer analysis (embedcache.analysis.layers)
    keys = sorted(
        (k for k in keys if k.layer == -1), key=lambda k: (k.model_id, k.digest)
    )
    chosen: list[ModelKey] = []
    for name in models:
        hits = match_keys(keys, name, aliases=aliases)
        if not hits:
            known = ", ".join(sorted({k.model_id for k in keys})) or "none"
            msg = (
                f"model {name!r} has no embeddings in the store (models there: {known}). "
                f"Run `make embeddings MODEL={name} VERSION={version}` first."
            )
            raise MissingEmbeddingsError(msg)
        chosen.extend(k for k in hits if k not in chosen)
    fallback = False
    if not models:
        chosen = [k for k in keys if not _is_floor_key(k)]
        if not chosen:
            chosen = [k for k in keys if _is_floor_key(k)]
            fallback = True
    floor_keys = [k for k in keys if _is_floor_key(k)]
    # A k-mer key stays a floor (is_floor in results.csv) even when it is ranked.
    ranked = [
        ModelEntry(n, k, _is_floor_key(k))
        for n, k in zip(_names(chosen, aliases), chosen, strict=True)
    ]
    floors = [ModelEntry(MAJORITY, None, True)]
    floors += [
        ModelEntry(n, k, True)
        for n, k in zip(_names(floor_keys, aliases), floor_keys, strict=True)
        if k not in chosen
    ]
    return ranked, floors, fallback


def check_complete(
    store: VectorStore, key: ModelKey, hashes: Sequence[str], *, version: str
) -> None:
    """Raise MissingEmbeddingsError unless every hash has a vector for ``key``."""
    found = np.asarray(store.contains(key, list(hashes)), dtype=bool)
    _raise_missing(store, key, int((~found).sum()), len(hashes), version=version)


def _raise_missing(
    store: VectorStore, key: ModelKey, n_missing: int, n: int, *, version: str
) -> None:
    if n_missing:
        where = getattr(store, "root", "the store")
        msg = (
            f"{n_missing} of {n} sequences of version {version} have no embedding "
            f"for {key.short()} (key {key.digest[:12]}) in {where}. "
            f"Run `make embeddings MODEL={key.model_id} VERSION={version}` first."
        )
        raise MissingEmbeddingsError(msg)


def load_vectors(
    store: VectorStore,
    key: ModelKey,
    hashes: Sequence[str],
    *,
    version: str,
) -> NDArray[np.float32]:
    """Vectors for ``hashes`` in order; every one must be present.

    Raises
    ------
    MissingEmbeddingsError
        Naming how many are missing, the key and the command that fills them.
    """
    vectors, found = store.get(key, list(hashes))
    _raise_missing(
        store, key, int((~np.asarray(found)).sum()), len(hashes), version=version
    )
    return np.asarray(vectors, dtype=np.float32)


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

    @property
    def entries(self) -> tuple[ModelEntry, ...]:
        return self.ranked + self.floors

    def entry(self, name: str) -> ModelEntry:
        for e in self.entries:
            if e.name == name:
                return e
        msg = f"no model {name!r} in this evaluation; it holds {[e.name for e in self.entries]}"
        raise KeyError(msg)

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
    keys = [_key_of(info) for info in infos]
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
        rows = []
        for e in entries:
            if e.key is None:
                rows.append(
                    np.full(test.height, majority_label(y_train), dtype=np.int64)
                )
                continue
            x_train = load_vectors(
                store, e.key, train["seq_sha256"].to_list(), version=version.name
            )
            fit = fit_probe(x_train, y_train, config=config)
            # Test vectors are read in chunks: 25,000 x 4096 (kmer-6) would be 0.4 GB.
            rows.append(
                np.concatenate(
                    [
                        fit.predict(
                            load_vectors(
                                store,
                                e.key,
                                test_hashes[i : i + _CHUNK],
                                version=version.name,
                            )
                        )
                        for i in range(0, len(test_hashes), _CHUNK)
                    ]
                    or [np.zeros(0, dtype=np.int64)]
                )
            )
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
    )


def results_frame(
    boot: BootstrapResult,
    entries: Sequence[ModelEntry],
    *,
    version: str,
    subset_id: str,
) -> pl.DataFrame:
    """The ``results.csv`` frame: one row per (model, dataset or mean, metric)."""
    summary = boot.summary()
    meta = pl.DataFrame(
        {
            "model": [e.name for e in entries],
            "model_key": [e.model_key for e in entries],
            "is_floor": [e.is_floor for e in entries],
            "_order": list(range(len(entries))),
        }
    )
    dataset_order = {d: i for i, d in enumerate((*boot.dataset_names, MEAN))}
    metric_order = {m: i for i, m in enumerate(METRICS)}
    return (
        summary.join(meta, on="model", how="left")
        .with_columns(
            pl.lit(version).alias("version"),
            pl.lit(subset_id).alias("subset_id"),
            pl.col("dataset").replace_strict(dataset_order).alias("_d"),
            pl.col("metric").replace_strict(metric_order).alias("_m"),
            pl.col("n").cast(pl.Int64),
        )
        .sort(["_order", "_d", "_m"])
        .select(RESULT_COLUMNS)
    )


def write_results(results: pl.DataFrame, path: Path | str) -> Path:
    """Write ``results.csv`` atomically (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        results.select(RESULT_COLUMNS).write_csv(tmp)
        Path(tmp).replace(path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    logger.info("wrote %d result rows to %s", results.height, path)
    return path


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


def model_vectors(
    subset: Subset,
    store: VectorStore,
    model: str,
    *,
    split: str = "test",
) -> tuple[dict[str, NDArray[np.float32]], dict[str, NDArray[np.int64]]]:
    """One model's vectors and labels per dataset for the items of one split."""
    infos = store.keys()
    keys = [_key_of(info) for info in infos]
    ranked, _, _ = select_models(
        keys, [model], version=subset.version.name, aliases=key_aliases(infos)
    )
    key = ranked[0].key
    vectors: dict[str, NDArray[np.float32]] = {}
    labels: dict[str, NDArray[np.int64]] = {}
    for name in subset.version.dataset_names:
        part = subset.items.filter(
            (pl.col("dataset") == name) & (pl.col("split") == split)
        )
        vectors[name] = load_vectors(
            store, key, part["seq_sha256"].to_list(), version=subset.version.name
        )
        labels[name] = part["label"].to_numpy().astype(np.int64)
    return vectors, labels


def analysis_results(evaluation: Evaluation, summary: pl.DataFrame) -> pl.DataFrame:
    """``results.csv`` rows for an analysis of ``evaluation`` (new metrics, same columns).

    ``summary`` has columns model, dataset, metric, value, ci_low, ci_high, n, with
    models named as in the evaluation; rows follow the evaluation's model order.
    """
    entries = evaluation.entries
    meta = pl.DataFrame(
        {
            "model": [e.name for e in entries],
            "model_key": [e.model_key for e in entries],
            "is_floor": [e.is_floor for e in entries],
            "_order": list(range(len(entries))),
        }
    )
    dataset_order = {d: i for i, d in enumerate((*evaluation.datasets, MEAN))}
    return (
        summary.join(meta, on="model", how="left")
        .with_columns(
            pl.lit(evaluation.version).alias("version"),
            pl.lit(evaluation.subset_id).alias("subset_id"),
            pl.col("dataset").replace_strict(dataset_order).alias("_d"),
            pl.col("n").cast(pl.Int64),
        )
        .sort(["_order", "metric", "_d"], maintain_order=True)
        .select(RESULT_COLUMNS)
    )
