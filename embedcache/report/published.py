"""Published frozen-probe results (``published.toml``): context for a report, never ranked.

Each source belongs to one shipped leaderboard version and is shown only beside it,
marked "published, not recomputed", with the ways its protocol differs from this
leaderboard's named. :func:`published_for` is the one gate: a version's content must
equal the shipped version of that name, so a user's file that merely reuses the name
gets no published rows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from embedcache.data.datasets import dataset_spec
from embedcache.data.versions import load_version, read_toml
from embedcache.errors import VersionSpecError

if TYPE_CHECKING:
    from embedcache.data.versions import VersionSpec

logger = logging.getLogger(__name__)

PUBLISHED_FILE = Path(__file__).parent / "published.toml"
STATUS = "published, not recomputed"


@dataclass(frozen=True, slots=True)
class PublishedRow:
    """One model's published numbers, as the source gives them."""

    model: str
    mean: float
    ci_low: float | None = None
    ci_high: float | None = None
    macro_f1: float | None = None
    datasets: dict[str, float] = field(default_factory=dict, hash=False)


@dataclass(frozen=True, slots=True)
class PublishedSource:
    """A paper's or board's results for one leaderboard version."""

    id: str
    version: str
    title: str
    citation: str
    metric: str
    differences: tuple[str, ...]
    rows: tuple[PublishedRow, ...]
    n_test: int | None = None


def load_published(path: Path | str = PUBLISHED_FILE) -> tuple[PublishedSource, ...]:
    """Every source of ``path``, validated.

    Raises
    ------
    VersionSpecError
        The file cannot be read, or a field is missing or out of range; the message
        names the source and row.
    """
    path = Path(path)
    raw = read_toml(path, what="the published results file")
    sources = tuple(_parse_source(entry, path) for entry in raw.get("sources", []))
    ids = [s.id for s in sources]
    if len(set(ids)) != len(ids):
        msg = f"{path}: a source id is used twice: {ids}"
        raise VersionSpecError(msg)
    return sources


def _parse_source(entry: dict[str, Any], path: Path) -> PublishedSource:
    name = entry.get("id", "<no id>")
    for key in ("id", "version", "title", "citation", "metric", "differences", "rows"):
        if key not in entry:
            msg = f"{path}: source {name!r} lacks the field {key!r}"
            raise VersionSpecError(msg)
    if not entry["differences"]:
        msg = (
            f"{path}: source {name!r} names no protocol difference; say how its "
            "numbers were obtained differently (or why they were not)"
        )
        raise VersionSpecError(msg)
    rows = tuple(_parse_row(row, f"{path}: source {name!r}") for row in entry["rows"])
    return PublishedSource(
        id=str(entry["id"]),
        version=str(entry["version"]),
        title=str(entry["title"]),
        citation=str(entry["citation"]),
        metric=str(entry["metric"]),
        differences=tuple(str(d) for d in entry["differences"]),
        rows=rows,
        n_test=entry.get("n_test"),
    )


def _parse_row(row: dict[str, Any], where: str) -> PublishedRow:
    model = row.get("model")
    if not model or "mean" not in row:
        msg = f"{where}: a row lacks 'model' or 'mean': {row}"
        raise VersionSpecError(msg)
    values = {"mean": row["mean"], **row.get("datasets", {})}
    for name in ("ci_low", "ci_high", "macro_f1"):
        if row.get(name) is not None:
            values[name] = row[name]
    for name, value in values.items():
        if not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
            msg = f"{where}, model {model!r}: {name} = {value!r} is not in [0, 1]"
            raise VersionSpecError(msg)
    low, high = row.get("ci_low"), row.get("ci_high")
    if (low is None) != (high is None) or (
        low is not None and not low <= row["mean"] <= high
    ):
        msg = (
            f"{where}, model {model!r}: the CI [{low}, {high}] must give both ends "
            f"and contain the mean {row['mean']}"
        )
        raise VersionSpecError(msg)
    for dataset in row.get("datasets", {}):
        try:
            dataset_spec(dataset)
        except VersionSpecError as err:
            msg = f"{where}, model {model!r}: {err}"
            raise VersionSpecError(msg) from err
    return PublishedRow(
        model=str(model),
        mean=float(row["mean"]),
        ci_low=None if low is None else float(low),
        ci_high=None if high is None else float(high),
        macro_f1=None if row.get("macro_f1") is None else float(row["macro_f1"]),
        datasets={k: float(v) for k, v in row.get("datasets", {}).items()},
    )


def _same_draw(a: VersionSpec, b: VersionSpec) -> bool:
    return (a.name, a.seed, a.comparable, a.datasets) == (
        b.name,
        b.seed,
        b.comparable,
        b.datasets,
    )


def published_for(
    version: VersionSpec,
    *,
    sources: tuple[PublishedSource, ...] | None = None,
) -> tuple[PublishedSource, ...]:
    """The published sources that belong beside ``version`` (often none).

    Only a version equal (name, seed, draws) to the shipped version of that name gets
    them: published numbers are context for that board and no other.
    """

    sources = load_published() if sources is None else sources
    mine = tuple(s for s in sources if s.version == version.name)
    if not mine:
        return ()
    try:
        shipped = load_version(version.name)
    except VersionSpecError:
        return ()
    if not _same_draw(version, shipped):
        logger.info(
            "version %s from %s differs from the shipped one: published rows not shown",
            version.name,
            version.path,
        )
        return ()
    return mine
