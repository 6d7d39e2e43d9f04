"""Verify: check every committed object's size and sha256, and the metadata.

Uncommitted leftovers and superseded runs awaiting removal are garbage, not
faults: readers never look at them (see ``collection``).
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
    RUNS_KIND,
    STORE_KIND,
    CommitRecord,
    commits_prefix,
    group_attrs,
    is_key_digest,
    log_path,
    log_prefix,
    parse_key_doc,
    run_prefix,
    runs_prefix,
    sha256,
)
from embedcache.store.run_reads import (
    MissingObjectError,
    Run,
    open_run,
    read_keys,
    vectors_of,
)
from embedcache.store.runs import ChunkError, bloom_of, fences_of, load_bloom
from embedcache.store.snapshots import list_records

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
        (runs_prefix(digest), RUNS_KIND),
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
            record = CommitRecord.from_doc(data, run=None, dim=dim, where=where)
        except CorruptStoreError as err:
            faults.append(Fault(backend.describe(path), str(err)))
            continue
        records.setdefault(record.run, record)
    hidden = {old for r in records.values() for old in r.supersedes}
    for name, record in sorted(records.items()):
        if name in hidden:
            continue
        found = verify_run(backend, digest, record)
        if found and not backend.exists(log_path(digest, record.seq or 0)):
            continue  # retired while we read it: not a fault
        faults.extend(found)
    return faults


def verify_run(
    backend: Backend,
    digest: str,
    record: CommitRecord,
    *,
    require_index: bool = True,
    rewritten: frozenset[str] = frozenset(),
) -> list[Fault]:
    """Faults of one committed run; ``require_index=False`` accepts a run of an
    older schema without a sorted index (migration checks those), and the arrays
    named in ``rewritten`` (an old index migration writes anew) are not looked at."""
    prefix = run_prefix(digest, record.run)
    present = {
        e.path[len(prefix) + 1 :]: e.size
        for e in backend.list(prefix + "/")
        if e.path[len(prefix) + 1 :].partition("/")[0] not in rewritten
    }
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
        faults.append(Fault(where, "object not in the run's commit record"))
    if not faults:
        faults.extend(_check_arrays(backend, digest, record, require_index))
    return faults


def _check_arrays(
    backend: Backend, digest: str, record: CommitRecord, require_index: bool
) -> list[Fault]:
    """Metadata and hashes of a run whose files match its record, and whether its
    sorted index agrees with its hashes."""
    run = Run(record=record, prefix=run_prefix(digest, record.run))
    try:
        keys = read_keys(backend, digest, run)
        vectors_of(backend, digest, run)
        if require_index or "fences/zarr.json" in record.files:
            opened = open_run(backend, digest, record)
            problem = None
            if not np.array_equal(opened.fences, fences_of(np.sort(keys))):
                problem = "its fences disagree with its hashes (sorted index damaged)"
            elif len(keys) and not np.array_equal(
                load_bloom(backend, opened), bloom_of(keys)
            ):
                problem = "its Bloom filter disagrees with its hashes"
            if problem is not None:
                return [Fault(backend.describe(run.prefix), problem)]
    except CorruptStoreError as err:
        return [Fault(backend.describe(run.prefix), str(err))]
    except MissingObjectError as err:
        return [Fault(backend.describe(err.path), "missing")]
    except ChunkError as err:
        return [Fault(backend.describe(err.path), err.problem)]
    return []
