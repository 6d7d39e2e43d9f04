"""Verify: check every committed object's size and sha256, and the metadata.

Uncommitted leftovers and superseded shards awaiting removal are garbage, not
faults: readers never look at them (see ``maintenance``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from embedcache.errors import CorruptStoreError, StoreError
from embedcache.store.layout import (
    COMMITS_KIND,
    LOG_KIND,
    META,
    SHARDS_KIND,
    STORE_KIND,
    CommitRecord,
    commits_prefix,
    group_attrs,
    is_key_digest,
    log_path,
    log_prefix,
    parse_key_doc,
    sha256,
    shard_prefix,
    shards_prefix,
)
from embedcache.store.runs import ChunkError, bloom_of, fences_of, load_bloom
from embedcache.store.shards import (
    MissingObjectError,
    Shard,
    open_shard,
    read_keys,
    vectors_of,
)
from embedcache.store.views import list_records

if TYPE_CHECKING:
    from embedcache.store.backend import Backend


@dataclass(frozen=True, slots=True)
class Fault:
    """Something ``verify`` found wrong: the object or folder, and the problem."""

    path: str  # a file path for a local store, else a URL
    problem: str

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}"


def verify_store(backend: Backend) -> list[Fault]:
    """Every fault in the store, sorted by location (``[]``: healthy)."""
    fault = _group_fault(backend, META, STORE_KIND, "no embedcache store here")
    if fault is not None:
        return [fault]
    faults = []
    folders, _ = backend.list_dir("")
    for digest in filter(is_key_digest, folders):
        faults.extend(verify_key(backend, digest))
    return sorted(faults, key=lambda f: (f.path, f.problem))


def _group_fault(backend: Backend, path: str, kind: str, absent: str) -> Fault | None:
    """The fault of the group metadata at ``path``, or None when it is sound."""
    doc = backend.read_or_none(path)
    try:
        if doc is None:
            msg = f"missing: {absent}"
            raise StoreError(msg)
        group_attrs(doc, backend.describe(path), kind=kind)
    except (StoreError, CorruptStoreError) as err:
        return Fault(backend.describe(path), str(err))
    return None


def verify_key(backend: Backend, digest: str) -> list[Fault]:
    meta = f"{digest}/{META}"
    doc = backend.read_or_none(meta)
    if doc is None:
        return []  # not a key group (yet): readers do not see it either
    try:
        _, dim = parse_key_doc(doc, backend.describe(meta), digest)
    except (StoreError, CorruptStoreError) as err:
        return [Fault(backend.describe(meta), str(err))]
    faults = []
    for folder, kind in (
        (shards_prefix(digest), SHARDS_KIND),
        (commits_prefix(digest), COMMITS_KIND),
        (log_prefix(digest), LOG_KIND),
    ):
        path = f"{folder}/{META}"
        fault = _group_fault(backend, path, kind, "the folder is not a zarr group")
        if fault is not None:
            faults.append(fault)
    records: dict[str, CommitRecord] = {}
    for name in sorted(list_records(backend, digest)):
        path = log_path(digest, int(name))
        data = backend.read_or_none(path)
        if data is None:
            continue  # retired since listed
        try:
            where = backend.describe(path)
            record = CommitRecord.from_doc(data, shard=None, dim=dim, where=where)
        except CorruptStoreError as err:
            faults.append(Fault(backend.describe(path), str(err)))
            continue
        records.setdefault(record.shard, record)
    hidden = {old for r in records.values() for old in r.supersedes}
    for name, record in sorted(records.items()):
        if name in hidden:
            continue
        found = verify_shard(backend, digest, record)
        if found and not backend.exists(log_path(digest, record.seq or 0)):
            continue  # retired while we read it: not a fault
        faults.extend(found)
    return faults


def verify_shard(
    backend: Backend,
    digest: str,
    record: CommitRecord,
    *,
    require_index: bool = True,
) -> list[Fault]:
    """Faults of one committed shard; ``require_index=False`` accepts a shard of an
    older schema without a sorted index (migration checks those)."""
    prefix = shard_prefix(digest, record.shard)
    present = {e.path[len(prefix) + 1 :]: e.size for e in backend.list(prefix + "/")}
    faults = []
    sized = []
    for rel, (size, _) in sorted(record.files.items()):
        where = backend.describe(f"{prefix}/{rel}")
        if rel not in present:
            faults.append(Fault(where, "missing (listed in the commit record)"))
        elif present[rel] != size:
            problem = (
                f"size {present[rel]} bytes, commit record says {size} (truncated?)"
            )
            faults.append(Fault(where, problem))
        else:
            sized.append(rel)

    def intact(rel: str) -> bool:
        try:
            return sha256(backend.read(f"{prefix}/{rel}")) == record.files[rel][1]
        except FileNotFoundError:
            return False

    for rel, ok in zip(sized, backend.map(intact, sized), strict=True):
        if not ok:
            where = backend.describe(f"{prefix}/{rel}")
            faults.append(Fault(where, "sha256 differs from the commit record"))
    for rel in sorted(present.keys() - record.files.keys()):
        where = backend.describe(f"{prefix}/{rel}")
        faults.append(Fault(where, "object not in the shard's commit record"))
    if not faults:
        faults.extend(_check_arrays(backend, digest, record, require_index))
    return faults


def _check_arrays(
    backend: Backend, digest: str, record: CommitRecord, require_index: bool
) -> list[Fault]:
    """Metadata and hashes of a shard whose files match its record, and whether its
    sorted index agrees with its hashes."""
    shard = Shard(record=record, prefix=shard_prefix(digest, record.shard))
    try:
        keys = read_keys(backend, digest, shard)
        vectors_of(backend, digest, shard)
        if require_index or "fences/zarr.json" in record.files:
            opened = open_shard(backend, digest, record)
            problem = None
            if not np.array_equal(opened.fences, fences_of(np.sort(keys))):
                problem = "its fences disagree with its hashes (sorted index damaged)"
            elif len(keys) and not np.array_equal(
                load_bloom(backend, opened), bloom_of(keys)
            ):
                problem = "its Bloom filter disagrees with its hashes"
            if problem is not None:
                return [Fault(backend.describe(shard.prefix), problem)]
    except CorruptStoreError as err:
        return [Fault(backend.describe(shard.prefix), str(err))]
    except MissingObjectError as err:
        return [Fault(backend.describe(err.path), "missing")]
    except ChunkError as err:
        return [Fault(backend.describe(err.path), err.problem)]
    return []
