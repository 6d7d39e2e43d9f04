"""Which store keys a board scores: model entries, floors, names and key matching.

A store key becomes a :class:`ModelEntry` with a display name. Floors (shown
unranked): the majority class of each dataset's train items, the ``kmer-K`` spectrum
probes and the ``gc`` (GC fraction) probe, read from the store like any model (keys
whose adapter is ``"kmer"`` or ``"gc"``). Random-init twins (revision
``random-init:<seed>``) are controls: shown unranked with the floors (is_floor true).
Only last-layer keys (layer -1) enter the board; a layer sweep's other keys are read
by :mod:`embedcache.analysis.layers`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from embedcache.errors import MissingEmbeddingsError
from embedcache.models import LOCAL_MODEL_ID

if TYPE_CHECKING:
    from embedcache.specs import ModelKey

FLOOR_ADAPTER = "kmer"
FLOOR_ADAPTERS = (FLOOR_ADAPTER, "gc")  # built-in floors: scored like models, unranked
MAJORITY = "majority"
MAJORITY_KEY = "builtin:majority-class"


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One scored row group: a store key (or the majority floor) and its display name."""

    name: str
    key: ModelKey | None
    is_floor: bool

    @property
    def model_key(self) -> str:
        return self.key.digest if self.key is not None else MAJORITY_KEY


def key_of(info: object) -> ModelKey:
    """The ModelKey of a ``store.keys()`` entry (a KeyInfo record, or a bare key)."""
    return getattr(info, "key", info)


def key_aliases(infos: Sequence[object]) -> dict[str, tuple[str, ...]]:
    """Digest -> the display aliases the store recorded for it (local models' folder
    names); bare ModelKeys have none."""
    return {key_of(i).digest: tuple(getattr(i, "aliases", ())) for i in infos}


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
