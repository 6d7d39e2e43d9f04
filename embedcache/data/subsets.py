"""Seeded, stratified, reproducible draws of the items a leaderboard version scores.

Everything here follows PROTOCOL.md to the letter, so anyone can recompute a draw:
largest-remainder quotas per label, a seed-hash rank within each label, train disjoint
by sequence from the whole test file, and a subset id hashed from the sorted item ids.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from embedcache.data.datasets import SplitData, load_split
from embedcache.errors import SubsetDrawError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from embedcache.data.versions import DatasetDraw, VersionSpec

logger = logging.getLogger(__name__)

MANIFEST_COLUMNS = ("item_id", "dataset", "split", "label", "seq", "seq_sha256")


@dataclass(frozen=True, slots=True)
class Subset:
    """The drawn items of a version, sorted by item id, and where their data came from."""

    version: VersionSpec
    items: pl.DataFrame  # MANIFEST_COLUMNS; split is the item's role: "train" or "test"
    subset_id: str
    sources: tuple[SplitData, ...]  # provenance of every file read (frames included)

    def provenance(self) -> list[dict[str, object]]:
        """One record per split read: dataset, split, source, files with sha256."""
        return [
            {
                "dataset": s.dataset,
                "split": s.split,
                "source": s.source,
                "files": [{"name": name, "sha256": digest} for name, digest in s.files],
            }
            for s in self.sources
        ]


def seed_rank(seed: int, item_id: str) -> str:
    """The protocol's rank key: lowercase hex sha256 of ``f"{seed}:{item_id}"``."""
    return hashlib.sha256(f"{seed}:{item_id}".encode()).hexdigest()


def largest_remainder_quotas(counts: Mapping[int, int], n: int) -> dict[int, int]:
    """Split ``n`` over labels in proportion to ``counts`` by the largest-remainder rule.

    Each label gets floor(n * share); the leftover items go, one each, to the labels with
    the largest fractional remainders (ties: the smaller label first). Integer arithmetic,
    so no float round-off can change a draw.
    """
    total = sum(counts.values())
    if n > total:
        msg = f"cannot draw {n} items from a pool of {total}"
        raise SubsetDrawError(msg)
    quotas = {label: n * count // total for label, count in counts.items()}
    remainders = {label: n * count % total for label, count in counts.items()}
    leftover = n - sum(quotas.values())
    for label in sorted(counts, key=lambda lab: (-remainders[lab], lab))[:leftover]:
        quotas[label] += 1
    return quotas


def draw_stratified(
    pool: pl.DataFrame, n: int, *, seed: int, what: str = "pool"
) -> pl.DataFrame:
    """Draw ``n`` rows of ``pool`` (columns item_id, label, ...) by the protocol.

    Labels are visited in ascending order; within a label, rows are ranked by
    :func:`seed_rank` ascending and the first ``quota`` are taken.
    """
    counts = dict(pool.group_by("label").len().iter_rows())
    try:
        quotas = largest_remainder_quotas(counts, n)
    except SubsetDrawError as err:
        err.add_note(f"while drawing from {what}")
        raise
    ranked = pool.with_columns(
        pl.col("item_id")
        .map_elements(lambda item: seed_rank(seed, item), return_dtype=pl.String)
        .alias("_rank")
    )
    parts = [
        ranked.filter(pl.col("label") == label).sort("_rank").head(quotas[label])
        for label in sorted(quotas)
    ]
    return pl.concat(parts).drop("_rank").sort("item_id")


def compute_subset_id(item_ids: Iterable[str]) -> str:
    """First 16 hex digits of sha256 over the sorted item ids joined by newlines."""
    joined = "\n".join(sorted(item_ids))
    return hashlib.sha256(joined.encode("utf-8")).hexdigest()[:16]


def draw_version(version: VersionSpec, *, data_dir: Path | None = None) -> Subset:
    """Draw every dataset of ``version``: train and test items with their sequences."""
    frames: list[pl.DataFrame] = []
    sources: list[SplitData] = []
    for draw in version.datasets:
        items, used = _draw_dataset(draw, seed=version.seed, data_dir=data_dir)
        frames.append(items)
        sources.extend(used)
    items = pl.concat(frames).sort("item_id").select(MANIFEST_COLUMNS)
    subset_id = compute_subset_id(items["item_id"])
    logger.info(
        "drew %s: %d items, subset id %s", version.name, items.height, subset_id
    )
    return Subset(
        version=version, items=items, subset_id=subset_id, sources=tuple(sources)
    )


def _draw_dataset(
    draw: DatasetDraw, *, seed: int, data_dir: Path | None
) -> tuple[pl.DataFrame, list[SplitData]]:
    test_data = load_split(
        draw.name, draw.test_split, data_dir=data_dir, source=draw.source
    )
    test_file = test_data.frame
    if draw.self_split:
        train = draw_stratified(
            test_file, draw.n_train, seed=seed, what=f"{draw.name}:{draw.train_split}"
        )
        # the rest, minus any row whose sequence train already holds
        rest = test_file.filter(
            ~pl.col("item_id").is_in(train["item_id"].implode())
            & ~pl.col("seq").is_in(train["seq"].implode())
        )
        test = _draw_test(rest, draw, seed=seed)
        used = [test_data]
    else:
        test = _draw_test(test_file, draw, seed=seed)
        train_data = load_split(
            draw.name, draw.train_split, data_dir=data_dir, source=draw.source
        )
        # disjoint by sequence against the whole published test file, not just the drawn test items
        candidates = train_data.frame.filter(
            ~pl.col("seq").is_in(test_file["seq"].implode())
        )
        dropped = train_data.frame.height - candidates.height
        logger.info(
            "%s: dropped %d train rows whose sequence is in the test file",
            draw.name,
            dropped,
        )
        train = draw_stratified(
            candidates, draw.n_train, seed=seed, what=f"{draw.name}:{draw.train_split}"
        )
        used = [test_data, train_data]
    items = pl.concat(
        [
            train.with_columns(pl.lit("train").alias("split")),
            test.with_columns(pl.lit("test").alias("split")),
        ]
    )
    return items.select(MANIFEST_COLUMNS), used


def _draw_test(pool: pl.DataFrame, draw: DatasetDraw, *, seed: int) -> pl.DataFrame:
    if draw.n_test is None:
        return pool
    return draw_stratified(
        pool, draw.n_test, seed=seed, what=f"{draw.name}:{draw.test_split}"
    )


def write_manifest(subset: Subset, path: Path) -> None:
    """Write the manifest TSV atomically, plus ``<path>.json`` with the id and provenance.

    A crash mid-write leaves any earlier manifest at ``path`` untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sidecar = {
        "version": subset.version.name,
        "comparable": subset.version.comparable,
        "seed": subset.version.seed,
        "subset_id": subset.subset_id,
        "n_items": subset.items.height,
        "sources": subset.provenance(),
    }
    _atomic_write(path, lambda tmp: subset.items.write_csv(tmp, separator="\t"))
    _atomic_write(
        path.with_name(path.name + ".json"),
        lambda tmp: tmp.write_text(json.dumps(sidecar, indent=2) + "\n"),
    )


def _atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        with tmp.open("rb") as fh:
            os.fsync(fh.fileno())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
