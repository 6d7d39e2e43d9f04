"""The commit records of a key group of schema 1, 2, 3 or 4, as schema-5 records.

Schema 1 (embedcache <= 0.1) kept them as ``commits/<run>.json`` in a format of
its own; schemas 2-4 as ``commits/<run>/zarr.json`` with the fields of today's
records. A schema-2 or -3 record is read without its sorted index (schema 2 had
none; schema 3's Bloom filter had one-word blocks): ``migrate`` writes it anew.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING

from embedcache.errors import CorruptStoreError
from embedcache.store.layout import (
    META,
    SCHEMA_VERSION,
    CommitRecord,
    commits_prefix,
    is_tombstone,
    parse_json,
    record_path,
)
from embedcache.store.run_reads import INDEX_ARRAYS

if TYPE_CHECKING:
    from embedcache.store.backend import Backend


def old_records(
    backend: Backend, digest: str, dim: int, version: int
) -> dict[str, CommitRecord]:
    """The key's commit records by run name (superseded runs' too)."""
    if version == 1:
        return _v1_records(backend, digest, dim)
    return _v2_records(backend, digest, dim)


def _v2_records(backend: Backend, digest: str, dim: int) -> dict[str, CommitRecord]:
    """The schema-2, -3 or -4 records of a key (read as schema 5: the same
    fields), a schema-3 record without its index: that is written anew."""
    folders, _ = backend.list_dir(commits_prefix(digest))
    out = {}
    for name in folders:
        path = record_path(digest, name)
        data = backend.read_or_none(path)
        if data is None or is_tombstone(data):
            continue
        where = backend.describe(path)
        doc = parse_json(data, where)
        attrs = doc.get("attributes", {}).get("embedcache")
        version = attrs.get("schema_version") if isinstance(attrs, dict) else None
        if isinstance(attrs, dict) and version in (2, 3, 4):
            attrs["schema_version"] = SCHEMA_VERSION
        record = CommitRecord.from_doc(
            json.dumps(doc).encode(), run=name, dim=dim, where=where
        )
        if version in (2, 3):  # schema 3's index has the old filter
            kept = {
                rel: v
                for rel, v in record.files.items()
                if rel.partition("/")[0] not in INDEX_ARRAYS
            }
            record = replace(record, files=kept)
        out[name] = record
    return out


def _v1_records(backend: Backend, digest: str, dim: int) -> dict[str, CommitRecord]:
    """The schema-1 commit records of a key, as schema-5 records."""
    prefix = commits_prefix(digest) + "/"
    out = {}
    for entry in backend.list(prefix):
        name = entry.path[len(prefix) :]
        # zarr.json: the group an interrupted migration of an older version made
        if "/" in name or name.startswith(".") or not name.endswith(".json"):
            continue
        if name == META:
            continue
        run = name.removesuffix(".json")
        where = backend.describe(entry.path)
        old = parse_json(backend.read(entry.path), where)
        try:
            if old["format"] != "embedcache-commit" or old["schema_version"] != 1:
                raise ValueError(f"format {old['format']!r} v{old['schema_version']!r}")  # noqa: EM102
            if old["shard"] != run or old["dim"] != dim:
                raise ValueError(f"run {old['shard']!r}, dim {old['dim']!r}")  # noqa: EM102
            out[run] = CommitRecord(
                run=run,
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
