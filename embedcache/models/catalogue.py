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


__all__ = ["CatalogueEntry", "CatalogueError", "load_catalogue"]
