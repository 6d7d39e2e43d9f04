"""Leaderboard versions, declared as data: one TOML file each, shipped in ``shipped_versions/``."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedcache.data.datasets import dataset_spec
from embedcache.errors import VersionSpecError

VERSIONS_DIR = Path(__file__).parent / "shipped_versions"
_SOURCES = ("hub", "mirror", "demo", "auto")


@dataclass(frozen=True, slots=True)
class DatasetDraw:
    """How one dataset's items are drawn in a version.

    ``n_test`` is a count, ``None`` for every row of the test file ("all"), or, in a
    self-split (``train_split == test_split``), ``None`` for every row train left ("rest").
    """

    name: str
    n_train: int
    n_test: int | None
    test_split: str = "test"
    train_split: str = "train"
    source: str = "auto"

    @property
    def self_split(self) -> bool:
        return self.train_split == self.test_split


@dataclass(frozen=True, slots=True)
class VersionSpec:
    name: str
    description: str
    seed: int
    comparable: bool  # False: results must never be shown beside the leaderboard's
    datasets: tuple[DatasetDraw, ...]
    path: Path

    @property
    def dataset_names(self) -> tuple[str, ...]:
        return tuple(draw.name for draw in self.datasets)


def read_toml(path: Path, *, what: str) -> dict[str, Any]:
    """The parsed TOML file; ``what`` names it in the error.

    Raises
    ------
    VersionSpecError
        The file cannot be read or is not TOML.
    """
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as err:
        msg = f"cannot read {what} {path}: {err}"
        raise VersionSpecError(msg) from err


def list_versions() -> list[VersionSpec]:
    """Every version shipped with the package, by name."""
    return [load_version(path) for path in sorted(VERSIONS_DIR.glob("*.toml"))]


def load_version(name_or_path: str | Path) -> VersionSpec:
    """Load a shipped version by name, or a user's version file by path.

    Raises
    ------
    VersionSpecError
        Unknown name, unreadable file, or a field that is missing or malformed.
    """
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = VERSIONS_DIR / f"{name_or_path}.toml"
        if not path.exists():
            known = ", ".join(p.stem for p in sorted(VERSIONS_DIR.glob("*.toml")))
            msg = f"unknown version {name_or_path!r}; shipped versions: {known}, or pass a .toml file"
            raise VersionSpecError(msg)
    raw = read_toml(path, what="version file")
    try:
        return _parse_version(raw, path)
    except VersionSpecError as err:
        err.add_note(f"while reading version file {path}")
        raise


_VERSION_FIELDS = ("name", "description", "seed", "comparable", "datasets")
_DRAW_FIELDS = ("name", "n_train", "n_test", "test_split", "train_split", "source")


def _is_int(value: object) -> bool:
    """An integer, and not a boolean (TOML's ``true`` is no count or seed)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _check_fields(table: dict, known: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(table) - set(known))
    if unknown:
        msg = (
            f"{where} has the unknown field {unknown[0]!r}; known fields: "
            f"{', '.join(known)} (check its spelling)"
        )
        raise VersionSpecError(msg)


def _parse_version(raw: dict, path: Path) -> VersionSpec:
    for field in ("name", "seed", "datasets"):
        if field not in raw:
            msg = f"version file lacks the field {field!r}"
            raise VersionSpecError(msg)
    _check_fields(raw, _VERSION_FIELDS, "the version file")
    if not isinstance(raw["name"], str) or not raw["name"].strip():
        msg = f"name must be a non-empty string, got {raw['name']!r}"
        raise VersionSpecError(msg)
    if not _is_int(raw["seed"]):
        msg = f"seed must be an integer, got {raw['seed']!r}"
        raise VersionSpecError(msg)
    if not isinstance(raw.get("description", ""), str):
        msg = f"description must be a string, got {raw['description']!r}"
        raise VersionSpecError(msg)
    if not isinstance(raw.get("comparable", False), bool):
        msg = f"comparable must be true or false, got {raw['comparable']!r}"
        raise VersionSpecError(msg)
    entries = raw["datasets"]
    if (
        not isinstance(entries, list)
        or not entries
        or not all(isinstance(e, dict) for e in entries)
    ):
        msg = f"datasets must be one or more [[datasets]] tables, got {entries!r}"
        raise VersionSpecError(msg)
    draws = tuple(_parse_draw(entry) for entry in entries)
    names = [draw.name for draw in draws]
    if len(set(names)) != len(names):
        msg = f"a dataset is listed twice: {names}"
        raise VersionSpecError(msg)
    return VersionSpec(
        name=raw["name"],
        description=raw.get("description", ""),
        seed=raw["seed"],
        comparable=raw.get("comparable", False),
        datasets=draws,
        path=path,
    )


def _parse_draw(entry: dict) -> DatasetDraw:
    name = entry.get("name")
    if name is None:
        msg = "a [[datasets]] entry lacks 'name'"
        raise VersionSpecError(msg)
    if not isinstance(name, str):
        msg = f"a [[datasets]] entry's name must be a string, got {name!r}"
        raise VersionSpecError(msg)
    _check_fields(entry, _DRAW_FIELDS, f"the [[datasets]] entry {name!r}")
    dataset_spec(name)  # unknown names fail here, listing the known ones
    test_split = entry.get("test_split", "test")
    train_split = entry.get("train_split", "train")
    for field, split in (("test_split", test_split), ("train_split", train_split)):
        if not isinstance(split, str) or not split:
            msg = f"{name}: {field} must be a split name (a string), got {split!r}"
            raise VersionSpecError(msg)
    source = entry.get("source", "auto")
    if source not in _SOURCES:
        msg = f"{name}: source {source!r} is not one of {', '.join(_SOURCES)}"
        raise VersionSpecError(msg)
    n_train = entry.get("n_train")
    if not _is_int(n_train) or n_train < 2:
        msg = f"{name}: n_train must be an integer >= 2 (a probe needs both classes), got {n_train!r}"
        raise VersionSpecError(msg)
    n_test_raw = entry.get("n_test")
    allowed_word = "rest" if test_split == train_split else "all"
    if n_test_raw == allowed_word:
        n_test = None
    elif _is_int(n_test_raw) and n_test_raw > 0:
        n_test = n_test_raw
    else:
        msg = f"{name}: n_test must be a positive integer or {allowed_word!r}, got {n_test_raw!r}"
        raise VersionSpecError(msg)
    return DatasetDraw(
        name=name,
        n_train=n_train,
        n_test=n_test,
        test_split=test_split,
        train_split=train_split,
        source=source,
    )
