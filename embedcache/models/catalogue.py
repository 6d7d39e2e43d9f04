"""The catalogue of known checkpoints (``catalogue.toml``), like mteb's ModelMeta records."""

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


def load_catalogue() -> list[CatalogueEntry]:
    """Every catalogue entry, sorted by family then hub id.

    Raises
    ------
    CatalogueError
        An entry lacks a field, has an unknown one, or repeats a hub id.
    """
    text = resources.files("embedcache.models").joinpath(CATALOGUE).read_text("utf-8")
    names = {f.name for f in fields(CatalogueEntry)}
    entries: list[CatalogueEntry] = []
    for i, raw in enumerate(tomllib.loads(text).get("model", [])):
        missing, unknown = names - set(raw), set(raw) - names
        if missing or unknown:
            msg = (
                f"{CATALOGUE} entry {i} ({raw.get('hub_id', '?')}): missing "
                f"{sorted(missing)}, unknown {sorted(unknown)}"
            )
            raise CatalogueError(msg)
        if raw["loading"] not in LOADINGS:
            msg = (
                f"{CATALOGUE} entry {raw['hub_id']}: loading must be one of {LOADINGS}"
            )
            raise CatalogueError(msg)
        entries.append(CatalogueEntry(**raw))
    ids = [e.hub_id for e in entries]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        msg = f"{CATALOGUE} lists {repeated} more than once"
        raise CatalogueError(msg)
    return sorted(entries, key=lambda e: (e.family, e.hub_id))


def catalogue_entry(hub_id: str) -> CatalogueEntry | None:
    """The catalogue's entry for ``hub_id`` (None when the checkpoint is not listed)."""
    return next((e for e in load_catalogue() if e.hub_id == hub_id), None)


__all__ = ["CatalogueEntry", "CatalogueError", "catalogue_entry", "load_catalogue"]
