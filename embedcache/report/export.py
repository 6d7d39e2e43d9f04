"""Export a version's items with one model's stored vectors, to probe in your own code.

One row per item of the version (train and test), in the manifest's order (sorted by
item id): ``item_id, dataset, split, label, seq_sha256`` and ``vector``, the float32
embedding. Two formats, chosen by the output's suffix:

- ``.parquet``: ``vector`` is a fixed-size ``Array(Float32, d)`` column (Arrow
  ``fixed_size_list<float>[d]``); the file's key-value metadata holds the version,
  subset id and the model key (:data:`METADATA_KEY`, JSON).
- ``.npz``: one array per column (strings as unicode), ``vector`` as (n, d) float32,
  and ``metadata`` (a JSON string); ``numpy.load`` needs no pickle.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from embedcache import __version__
from embedcache.analysis.selection import key_aliases, match_keys
from embedcache.analysis.vectors import load_vectors
from embedcache.errors import AmbiguousModelError, ExportError, MissingEmbeddingsError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from embedcache.analysis.vectors import VectorStore
    from embedcache.data.subsets import Subset
    from embedcache.data.versions import VersionSpec
    from embedcache.specs import ModelKey
    from embedcache.store import EmbeddingStore

logger = logging.getLogger(__name__)

EXPORT_COLUMNS = ("item_id", "dataset", "split", "label", "seq_sha256", "vector")
FORMATS = (".parquet", ".npz")
METADATA_KEY = "embedcache"


@dataclass(frozen=True)
class Export:
    """The exported frame, the key its vectors came from, and what the file records."""

    frame: pl.DataFrame  # EXPORT_COLUMNS
    key: ModelKey
    metadata: dict[str, Any]

    @property
    def dim(self) -> int:
        return self.frame.schema["vector"].size  # type: ignore[union-attr]


def check_format(path: Path | str) -> str:
    """The output format (``".parquet"`` or ``".npz"``) of ``path``.

    Raises
    ------
    ExportError
        The suffix is neither.
    """
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        msg = (
            f"cannot export to {path}: the format follows the suffix, which must be "
            f".parquet or .npz (got {suffix or 'none'!r})"
        )
        raise ExportError(msg)
    return suffix


def resolve_key(
    store: VectorStore, model: str, *, version: str = "VERSION"
) -> ModelKey:
    """The one key of the store that ``model`` names (as ``report --models`` matches).

    Raises
    ------
    MissingEmbeddingsError
        No key matches; the message gives the command that fills the store.
    AmbiguousModelError
        Several keys match (e.g. two RC modes of one model); the message lists them
        with the digest prefix that picks each.
    """
    infos = store.keys()  # KeyInfo records (bare ModelKeys in tests)
    keys = sorted(
        (getattr(info, "key", info) for info in infos),
        key=lambda k: (k.model_id, k.digest),
    )
    hits = match_keys(keys, model, aliases=key_aliases(infos))
    if not hits:
        known = ", ".join(sorted({k.model_id for k in keys})) or "none"
        msg = (
            f"model {model!r} has no embeddings in {getattr(store, 'root', 'the store')} "
            f"(models there: {known}). "
            f"Run `make embeddings MODEL={model} VERSION={version}` first."
        )
        raise MissingEmbeddingsError(msg)
    if len(hits) > 1:
        listing = "; ".join(f"{k.digest[:12]} = {k.short()}" for k in hits)
        msg = (
            f"model {model!r} matches {len(hits)} keys in "
            f"{getattr(store, 'root', 'the store')}: {listing}. Pick one by its key "
            f"digest, e.g. --model {hits[0].digest[:12]} (8 or more hex digits; "
            "`embedcache store ls` lists them)."
        )
        raise AmbiguousModelError(msg)
    return hits[0]


def export_frame(subset: Subset, store: VectorStore, model: str) -> Export:
    """Every item of ``subset`` with ``model``'s vector, in manifest order.

    Raises
    ------
    MissingEmbeddingsError
        The model has no key in the store, or some items have no vector; the message
        gives the ``make embeddings`` command.
    AmbiguousModelError
        ``model`` matches several keys.
    """
    version = subset.version.name
    key = resolve_key(store, model, version=version)
    items = subset.items
    hashes = items["seq_sha256"].to_list()
    # a sequence shared by two items is read once
    unique, inverse = np.unique(np.asarray(hashes, dtype=object), return_inverse=True)
    vectors = load_vectors(store, key, unique.tolist(), version=version)[inverse]
    frame = items.select(EXPORT_COLUMNS[:-1]).with_columns(
        pl.Series("vector", np.ascontiguousarray(vectors, dtype=np.float32))
    )
    metadata = {
        "format": "embedcache export 1",
        "version": version,
        "comparable": subset.version.comparable,
        "subset_id": subset.subset_id,
        "model": key.model_id,
        "model_key": key.digest,
        "model_key_json": key.canonical_json(),
        "embedcache_version": __version__,
        "columns": list(EXPORT_COLUMNS),
    }
    return Export(frame=frame, key=key, metadata=metadata)


def write_export(export: Export, path: Path | str) -> Path:
    """Write ``export`` atomically as ``.parquet`` or ``.npz`` (by suffix).

    Raises
    ------
    ExportError
        The suffix is neither ``.parquet`` nor ``.npz``.
    """
    path = Path(path)
    suffix = check_format(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        if suffix == ".parquet":
            export.frame.write_parquet(
                tmp, metadata={METADATA_KEY: json.dumps(export.metadata)}
            )
        else:
            frame = export.frame
            arrays = {
                name: frame[name].to_numpy().astype(str)
                for name in ("item_id", "dataset", "split", "seq_sha256")
            }
            with Path(tmp).open("wb") as fh:
                np.savez(
                    fh,
                    **arrays,
                    label=frame["label"].to_numpy(),
                    vector=frame["vector"].to_numpy().astype(np.float32, copy=False),
                    metadata=np.array(json.dumps(export.metadata)),
                )
        Path(tmp).replace(path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    logger.info(
        "exported %d items x %d float32 of %s to %s",
        export.frame.height,
        export.dim,
        export.key.short(),
        path,
    )
    return path


def export_version(
    version: VersionSpec | str | os.PathLike[str],
    model: str,
    store: EmbeddingStore | str | os.PathLike[str],
    output: Path | str,
    *,
    data_dir: Path | None = None,
    store_options: Mapping[str, str] | None = None,
) -> tuple[Subset, Export]:
    """Draw a version and write every item with ``model``'s stored vector to ``output``.

    The format is checked before the draw, which can take a while; a store given by
    location must exist (it is opened with ``store_options``).

    Returns
    -------
    tuple
        The drawn subset and what was written.

    Raises
    ------
    ExportError
        ``output`` is neither ``.parquet`` nor ``.npz``.
    MissingEmbeddingsError, AmbiguousModelError
        As :func:`export_frame`.
    """
    from embedcache.data.subsets import draw_version
    from embedcache.data.versions import VersionSpec, load_version
    from embedcache.store import EmbeddingStore

    check_format(output)
    spec = version if isinstance(version, VersionSpec) else load_version(version)
    if not isinstance(store, EmbeddingStore):
        store = EmbeddingStore(store, options=store_options, create=False)
    subset = draw_version(spec, data_dir=data_dir)
    export = export_frame(subset, store, model)
    write_export(export, output)
    return subset, export


def read_metadata(path: Path | str) -> dict[str, Any]:
    """The metadata an export file records (version, subset id, model key...)."""
    path = Path(path)
    if check_format(path) == ".parquet":
        return json.loads(pl.read_parquet_metadata(path)[METADATA_KEY])
    with np.load(path, allow_pickle=False) as data:
        return json.loads(str(data["metadata"]))
