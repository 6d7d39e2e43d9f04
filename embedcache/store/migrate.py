"""Convert a schema-1, -2 or -3 store to schema 4, in place.

Schema 1 (embedcache <= 0.1) kept commit records as ``commits/<shard>.json`` and
had no ``zarr.json`` in ``shards/`` and ``commits/``. Schema 2 had no sorted index
in its shards. Schema 3's Bloom filters had one-word blocks (16 bits a hash, 0.47%
false positives; schema 4: split blocks of eight words, 20 bits, 0.025%).
Migration checks every committed shard (size and sha256 of each file, then its
metadata), reads its hashes once and writes its sorted index (``sorted_hashes``,
``sorted_rows``, ``fences``, ``bloom``; a schema-3 shard's anew) into the shard's
folder, writes the schema-4 record (the old files and the new), removes superseded
shards, flips each key group to schema 4, and the root last. Vectors are never
rewritten. Until the root flips, the store keeps its old schema (refused by this
embedcache with a pointer here), so an interrupted migration is simply run again:
each step is written again whole. Run it while nobody writes the store.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from embedcache.errors import CorruptStoreError, StoreError
from embedcache.specs import ModelKey
from embedcache.store.commits import publish, retire
from embedcache.store.groups import open_backend
from embedcache.store.layout import (
    COMMITS_KIND,
    KEY_KIND,
    LOG_KIND,
    META,
    SCHEMA_VERSION,
    SHARDS_KIND,
    STORE_KIND,
    CommitRecord,
    commits_prefix,
    group_doc,
    is_key_digest,
    is_tombstone,
    key_attrs,
    log_path,
    log_prefix,
    parse_json,
    record_path,
    shard_prefix,
    shards_prefix,
)
from embedcache.store.shard_writes import write_index
from embedcache.store.shards import INDEX_ARRAYS, Shard, read_keys
from embedcache.store.verify import verify_shard

if TYPE_CHECKING:
    from collections.abc import Mapping

    from embedcache.store.backend import Backend

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Migration:
    """What ``migrate_store`` did."""

    from_version: int
    n_keys: int  # key groups converted
    n_shards: int  # committed shards carried over


def migrate_store(
    root: str | os.PathLike[str] | Any,  # noqa: ANN401 (or an obstore store)
    *,
    options: Mapping[str, str] | None = None,
) -> Migration:
    """Convert the store at ``root`` to schema 4 in place (nothing is recomputed).

    Raises
    ------
    CorruptStoreError
        A committed shard fails its checks; that key is left unchanged.
        Delete the named commit record (its rows will be recomputed) and run again.
    StoreError
        ``root`` is no embedcache store, or of an unknown schema.
    """
    backend = open_backend(root, options, create=False)
    doc = backend.read_or_none(META)
    attrs = _attrs(doc, backend, META, STORE_KIND)
    version = attrs.get("schema_version")
    if version == SCHEMA_VERSION:
        return Migration(from_version=SCHEMA_VERSION, n_keys=0, n_shards=0)
    if version not in (1, 2, 3, 4):
        msg = (
            f"{backend.describe(META)} has schema_version {version!r}; migrate "
            f"converts 1, 2, 3 or 4 to {SCHEMA_VERSION}"
        )
        raise StoreError(msg)
    folders, _ = backend.list_dir("")
    n_keys = n_shards = 0
    for digest in filter(is_key_digest, folders):
        converted = _migrate_key(backend, digest)
        if converted is not None:
            n_keys += 1
            n_shards += converted
    attrs["schema_version"] = SCHEMA_VERSION
    backend.write(META, group_doc(attrs))
    backend.sync([META])
    logger.info(
        "migrated %s to schema %d: %d keys", backend.location, SCHEMA_VERSION, n_keys
    )
    return Migration(from_version=version, n_keys=n_keys, n_shards=n_shards)


def _attrs(doc: bytes | None, backend: Backend, path: str, kind: str) -> dict[str, Any]:
    where = backend.describe(path)
    if doc is None:
        msg = f"no embedcache store at {backend.location} ({where} is missing)"
        raise StoreError(msg)
    attrs = parse_json(doc, where).get("attributes", {}).get("embedcache")
    if not isinstance(attrs, dict) or attrs.get("kind") != kind:
        msg = f"{where} is not an embedcache {kind}"
        raise StoreError(msg)
    return attrs


def _migrate_key(backend: Backend, digest: str) -> int | None:
    """Convert one key group; return its committed shards (None if converted)."""
    path = f"{digest}/{META}"
    doc = backend.read_or_none(path)
    if doc is None:
        return None
    attrs = _attrs(doc, backend, path, KEY_KIND)
    if attrs.get("schema_version") == SCHEMA_VERSION:
        _remove_v1_leftovers(backend, digest, set())
        return None
    try:
        key = ModelKey.from_json(attrs["key_json"])
        dim = int(attrs["dim"])
    except (KeyError, TypeError, ValueError) as err:
        msg = f"{backend.describe(path)}: unreadable model key ({err})"
        raise CorruptStoreError(msg) from err
    if attrs.get("schema_version") == 1:
        records = _v1_records(backend, digest, dim)
    else:
        records = _v2_records(backend, digest, dim)
    hidden = {old for r in records.values() for old in r.supersedes}
    visible = [r for name, r in sorted(records.items()) if name not in hidden]
    # an interrupted run's index of a shard is not in its record yet: written anew
    backend.delete_prefixes(
        f"{shard_prefix(digest, r.shard)}/{name}"
        for r in visible
        if _INDEX_DOC not in r.files
        for name in INDEX_ARRAYS
    )
    faults = [
        f
        for r in visible
        for f in verify_shard(backend, digest, r, require_index=False)
    ]
    if faults:
        listed = "\n  ".join(map(str, faults))
        msg = (
            f"{len(faults)} fault(s) in {key.short()} ({digest[:12]}); the key was not "
            f"migrated:\n  {listed}"
        )
        raise CorruptStoreError(msg)
    for folder, kind in (
        (shards_prefix(digest), SHARDS_KIND),
        (commits_prefix(digest), COMMITS_KIND),
        (log_prefix(digest), LOG_KIND),
    ):
        group = group_doc({"kind": kind, "schema_version": SCHEMA_VERSION})
        if not backend.create(f"{folder}/{META}", group):
            backend.write(f"{folder}/{META}", group)
    published = visible
    if attrs.get("schema_version") != 4:  # a schema-4 key's records stand
        published = [_with_index(backend, digest, r) for r in visible]
        for record in published:
            at = record_path(digest, record.shard)
            if not backend.create(at, record.to_doc()):
                backend.write(at, record.to_doc())
            backend.sync([at])
    _write_log(backend, digest, published)
    # superseded shards' records are of the old schema: they go before the flip
    retire(backend, digest, sorted(hidden & records.keys()))
    backend.write(path, group_doc(key_attrs(key, dim)))
    backend.sync([path])
    _remove_v1_leftovers(backend, digest, hidden)
    return len(visible)


def _write_log(backend: Backend, digest: str, visible: list[CommitRecord]) -> None:
    """Publish the runs in the key's log, in the order old readers served them
    (``order_ns``, then name): what they were served stays what is served. An
    interrupted migration's entries are kept and the rest added after them."""
    names, _ = backend.list_dir(log_prefix(digest))
    seqs = sorted(int(n) for n in names if n.isdigit())
    docs = backend.read_many(log_path(digest, q) for q in seqs)
    done = set()
    for doc in docs:
        if doc is not None:
            done.add(parse_json(doc, digest)["attributes"]["embedcache"]["shard"])
    top = max(seqs, default=0)
    for record in sorted(visible, key=lambda r: (r.order_ns, r.shard)):
        if record.shard not in done:
            top = publish(backend, digest, record, start=top + 1).seq or top


_INDEX_DOC = "fences/zarr.json"


def _with_index(backend: Backend, digest: str, record: CommitRecord) -> CommitRecord:
    """The record of a shard whose sorted index is written (now, if it lacks one)."""
    if _INDEX_DOC in record.files:
        return record
    prefix = shard_prefix(digest, record.shard)
    keys = read_keys(backend, digest, Shard(record=record, prefix=prefix))
    files = write_index(backend, prefix, keys)
    backend.sync(f"{prefix}/{rel}" for rel in files)
    return replace(record, files=dict(sorted({**record.files, **files}.items())))


def _v2_records(backend: Backend, digest: str, dim: int) -> dict[str, CommitRecord]:
    """The schema-2 or -3 records of a key (schema 4 where a run converted them),
    a schema-3 record without its index: that is written anew."""
    folders, _ = backend.list_dir(commits_prefix(digest))
    out = {}
    for name in folders:
        path = record_path(digest, name)
        data = backend.read_or_none(path)
        if data is None:
            continue
        where = backend.describe(path)
        doc = parse_json(data, where)
        attrs = doc.get("attributes", {}).get("embedcache")
        if is_tombstone(data):
            continue  # a collector's claim of a run never committed
        old = isinstance(attrs, dict) and attrs.get("schema_version") in (2, 3)
        if isinstance(attrs, dict) and attrs.get("schema_version") in (2, 3, 4):
            attrs["schema_version"] = SCHEMA_VERSION  # same fields: read as 5
        record = CommitRecord.from_doc(
            json.dumps(doc).encode(), shard=name, dim=dim, where=where
        )
        if old:  # schema 3's index has the old filter
            kept = {
                rel: v
                for rel, v in record.files.items()
                if rel.partition("/")[0] not in INDEX_ARRAYS
            }
            record = replace(record, files=kept)
        out[name] = record
    return out


def _v1_records(backend: Backend, digest: str, dim: int) -> dict[str, CommitRecord]:
    """The schema-1 commit records of a key, as schema-2 records."""
    prefix = commits_prefix(digest) + "/"
    out = {}
    for entry in backend.list(prefix):
        name = entry.path[len(prefix) :]
        # zarr.json: the schema-2 group an interrupted migration made already
        if "/" in name or name.startswith(".") or not name.endswith(".json"):
            continue
        if name == META:
            continue
        shard = name.removesuffix(".json")
        where = backend.describe(entry.path)
        old = parse_json(backend.read(entry.path), where)
        try:
            if old["format"] != "embedcache-commit" or old["schema_version"] != 1:
                raise ValueError(f"format {old['format']!r} v{old['schema_version']!r}")  # noqa: EM102
            if old["shard"] != shard or old["dim"] != dim:
                raise ValueError(f"shard {old['shard']!r}, dim {old['dim']!r}")  # noqa: EM102
            out[shard] = CommitRecord(
                shard=shard,
                writer=str(old["writer"]),
                n_rows=int(old["n_rows"]),
                dim=dim,
                order_ns=int(old["order_ns"]),
                committed_ns=int(old["committed_ns"]),
                supersedes=tuple(str(s) for s in old["supersedes"]),
                aliases=(),
                files={
                    str(rel): (int(v["size"]), str(v["sha256"]))
                    for rel, v in old["files"].items()
                },
            )
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            msg = f"{where}: schema-1 commit record is malformed ({err})"
            raise CorruptStoreError(msg) from err
    return out


def _remove_v1_leftovers(backend: Backend, digest: str, superseded: set[str]) -> None:
    """Old records and temp files, retired and superseded shard folders."""
    prefix = commits_prefix(digest) + "/"
    for entry in backend.list(prefix):
        name = entry.path[len(prefix) :]
        if "/" not in name and name != META and name.endswith((".json", ".tmp")):
            backend.delete(entry.path)
    folders, _ = backend.list_dir(shards_prefix(digest))
    for name in folders:
        if name.startswith(".retired.") or name in superseded:
            backend.delete_prefix(shard_prefix(digest, name))
