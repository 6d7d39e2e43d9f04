"""Train/test overlap: the pretraining corpus of each board row, when it holds the human genome.

All three datasets are windows of the human reference genome (hg38), so a model
pretrained on a corpus holding that genome has seen every test window (without
its label). The catalogue (``embedcache/models/catalogue.toml``) records each known
checkpoint's corpus and where it is stated; a user declares one for any other
model in a small TOML passed to ``embedcache report --overlap FILE``, without
touching store keys::

    ["my-org/my-model"]          # a model id (as in the store) or a board name
    pretraining_data = "hg38 and 20 primate genomes"
    human_genome = "hg38"         # "" when the corpus holds no human genome
    source = "our preprint, section 2"
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from embedcache.errors import EmbedcacheError
from embedcache.models.catalogue import load_catalogue

if TYPE_CHECKING:
    from collections.abc import Mapping

    from embedcache.analysis.selection import ModelEntry

logger = logging.getLogger(__name__)

NOT_DECLARED = "not declared"
NONE = "none"
OVERLAP_NOTE = (
    "Overlap: the train/test overlap declared for the model, the human genome held by "
    "the corpus it was pretrained on (as its model card or paper states it, recorded in "
    "embedcache's catalogue or declared with `embedcache report --overlap FILE`). All "
    "three datasets are windows of the human reference genome (hg38): a model with an "
    "overlap has seen every test sequence during pretraining, without its label. It "
    "does not invalidate a score, but it is not a held-out genome. Floors and random-init "
    "controls learn nothing before the probe (none); 'not declared': nobody said."
)
_FIELDS = {"pretraining_data", "human_genome", "source"}


class OverlapFileError(EmbedcacheError, ValueError):
    """An overlap declaration file cannot be read or is malformed."""


@dataclass(frozen=True, slots=True)
class Declaration:
    """One model's pretraining corpus, the human genome in it, and where that is stated."""

    pretraining_data: str
    human_genome: str
    source: str

    @property
    def overlap(self) -> str:
        return self.human_genome or NONE


def catalogue_declarations() -> dict[str, Declaration]:
    """hub id -> the catalogue's declaration, for every known checkpoint."""
    return {
        e.hub_id: Declaration(e.pretraining_data, e.human_genome, e.pretraining_source)
        for e in load_catalogue()
    }


def read_declarations(path: Path | str) -> dict[str, Declaration]:
    """A user's overlap TOML: one table per model id or board name.

    Raises
    ------
    OverlapFileError
        The file is missing, not TOML, or a table lacks ``pretraining_data`` and
        ``human_genome`` or has other fields.
    """
    import tomllib

    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text("utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as err:
        msg = f"overlap file {path}: {err}. Pass a TOML file with one table per model."
        raise OverlapFileError(msg) from err
    out: dict[str, Declaration] = {}
    for model, table in raw.items():
        if not isinstance(table, dict):
            msg = f'overlap file {path}: {model!r} must be a table (["{model}"])'
            raise OverlapFileError(msg)
        missing = {"pretraining_data", "human_genome"} - set(table)
        unknown = set(table) - _FIELDS
        if missing or unknown:
            msg = (
                f"overlap file {path}, model {model!r}: missing {sorted(missing)}, "
                f"unknown {sorted(unknown)}; the fields are {sorted(_FIELDS)}"
            )
            raise OverlapFileError(msg)
        out[model] = Declaration(
            str(table["pretraining_data"]),
            str(table["human_genome"]),
            str(table.get("source", "declared for this report")),
        )
    return out


def entry_overlap(
    entry: ModelEntry, declared: Mapping[str, Declaration] | None = None
) -> str:
    """What the board's Overlap column says for one row.

    A user's declaration (by board name, then model id) wins over the catalogue; a
    floor or random-init control says none; an unknown model says not declared.
    """
    declared = declared or {}
    key = entry.key
    for name in (entry.name, key.model_id if key is not None else None):
        if name is not None and name in declared:
            return declared[name].overlap
    if key is None or entry.is_floor or key.revision.startswith("random-init:"):
        return NONE
    known = catalogue_declarations().get(key.model_id)
    return known.overlap if known is not None else NOT_DECLARED


def name_overlap(model: str, declared: Mapping[str, Declaration] | None = None) -> str:
    """The Overlap of a published row, named as its source names the model."""
    if declared and model in declared:
        return declared[model].overlap
    known = catalogue_declarations().get(model)
    return known.overlap if known is not None else NOT_DECLARED
