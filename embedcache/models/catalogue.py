"""The catalogue (``catalogue.toml``): known checkpoints, like mteb's ModelMeta records,
and one record per family saying what it loads into and how equality with the
official code was shown."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from importlib import resources

from embedcache.errors import EmbedcacheError

CATALOGUE = "catalogue.toml"
LOADINGS = ("embedcache module", "native transformers")


class CatalogueError(EmbedcacheError, ValueError):
    """The packaged catalogue is malformed (a packaging bug, not a user error)."""


@dataclass(frozen=True, slots=True)
class CatalogueEntry:
    """One published checkpoint embedcache knows how to load."""

    hub_id: str
    family: str
    params: str
    context: int
    tokenizer: str
    rc_default: str
    licence: str
    loading: str
    pretraining_data: str  # the corpus the published weights saw
    pretraining_source: str  # where that is stated: model card, paper
    human_genome: str  # the human genome in that corpus; "" when none


@dataclass(frozen=True, slots=True)
class FamilyRecord:
    """What one family's checkpoints load into, and the evidence of equality."""

    family: str  # the family module's FAMILY
    loaded_into: str
    equality: str  # how equality with the official code was shown, and its test


def _records(table: str) -> list[dict[str, object]]:
    """The catalogue's ``[[table]]`` entries, as written."""
    text = resources.files("embedcache.models").joinpath(CATALOGUE).read_text("utf-8")
    return tomllib.loads(text).get(table, [])


def _checked(raw: dict[str, object], kind: type, label: str) -> None:
    """Refuse an entry that lacks a field of ``kind`` or has one it does not know."""
    names = {f.name for f in fields(kind)}
    missing, unknown = names - set(raw), set(raw) - names
    if missing or unknown:
        msg = (
            f"{CATALOGUE} {label}: missing {sorted(missing)}, unknown {sorted(unknown)}"
        )
        raise CatalogueError(msg)


def _unique(names: list[str], what: str) -> None:
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        msg = f"{CATALOGUE} lists {what} {repeated} more than once"
        raise CatalogueError(msg)


def load_catalogue() -> list[CatalogueEntry]:
    """Every catalogue entry, sorted by family then hub id.

    Raises
    ------
    CatalogueError
        An entry lacks a field, has an unknown one, or repeats a hub id.
    """
    entries: list[CatalogueEntry] = []
    for i, raw in enumerate(_records("model")):
        _checked(raw, CatalogueEntry, f"entry {i} ({raw.get('hub_id', '?')})")
        if raw["loading"] not in LOADINGS:
            msg = (
                f"{CATALOGUE} entry {raw['hub_id']}: loading must be one of {LOADINGS}"
            )
            raise CatalogueError(msg)
        entries.append(CatalogueEntry(**raw))
    _unique([e.hub_id for e in entries], "hub ids")
    return sorted(entries, key=lambda e: (e.family, e.hub_id))


def load_family_records() -> dict[str, FamilyRecord]:
    """The ``[[family]]`` records by family name.

    Raises
    ------
    CatalogueError
        A record lacks a field, has an unknown one, or repeats a family.
    """
    records: list[FamilyRecord] = []
    for i, raw in enumerate(_records("family")):
        _checked(raw, FamilyRecord, f"family record {i} ({raw.get('family', '?')})")
        records.append(FamilyRecord(**raw))
    _unique([r.family for r in records], "families")
    return {r.family: r for r in records}


def catalogue_entry(hub_id: str) -> CatalogueEntry | None:
    """The catalogue's entry for ``hub_id`` (None when the checkpoint is not listed)."""
    return next((e for e in load_catalogue() if e.hub_id == hub_id), None)


__all__ = [
    "CatalogueEntry",
    "CatalogueError",
    "FamilyRecord",
    "catalogue_entry",
    "load_catalogue",
    "load_family_records",
]
