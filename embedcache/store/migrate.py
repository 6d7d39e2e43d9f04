"""Convert a store of schema 1, 2, 3 or 4 to schema 5: copy, verify, flip, clean up.

Schema 1 (embedcache <= 0.1) kept commit records as ``commits/<run>.json`` and
had no ``zarr.json`` in ``shards/`` and ``commits/``. Schema 2 had no sorted index
in its runs. Schema 3's Bloom filters had one-word blocks (16 bits a hash, 0.47%
false positives; since schema 4: split blocks of eight words, 20 bits, 0.025%).
Schema 4 ordered a key's runs by the writers' clocks (``order_ns``); schema 5 by
the key's log (``log/<seq>``), whose entries the storage orders.

Every key's runs are checked (size and sha256 of each object, then the
metadata) before anything is written: a key that fails leaves the whole store
byte for byte as it was. Then, one key at a time:

1. **copy**: each visible run ``R`` is copied to a run of a new name,
   ``R~v5`` (its vectors and hashes byte for byte; its sorted index as it was
   in schema 4, written anew from its hashes before), beside the old objects,
   which are never modified;
2. **verify** the copies against their new records, and publish them in the
   key's log, ``log/1..n`` in the order old readers served them (put-if-absent;
   the names and bytes are deterministic, so a re-run writes the same);
3. **flip**: the key group's ``zarr.json`` is rewritten as schema 5, one atomic
   write; until then an old reader reads the key as it always did (it never
   looks at ``log/`` or at a run its records do not name);
4. **clean up**: the new runs' claims (``commits/<run>``) are written, the old
   records and run folders deleted.

The root flips last, once every key is converted: until then this embedcache
refuses the store and points here, and a killed migration is simply run again
(a flipped key is cleaned up; an unflipped one copied again). Nothing is
recomputed. Run it while nobody writes the store: it refuses while a writer of
an older schema holds a lease. See ``docs/store/migrate.md``.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from embedcache.errors import CorruptStoreError, StoreError
from embedcache.specs import ModelKey
from embedcache.store.groups import open_backend
from embedcache.store.layout import (
    COMMITS_KIND,
    KEY_KIND,
    LEASES,
    LOG_KIND,
    META,
    RUN_ATTR,
    RUNS_KIND,
    SCHEMA_VERSION,
    STORE_KIND,
    CommitRecord,
    commits_prefix,
    group_doc,
    is_key_digest,
    is_tombstone,
    key_attrs,
    lease_path,
    log_path,
    log_prefix,
    parse_json,
    parse_key_doc,
    record_path,
    run_prefix,
    runs_prefix,
    sha256,
)
from embedcache.store.old_records import old_records
from embedcache.store.run_reads import INDEX_ARRAYS, read_keys
from embedcache.store.run_writes import write_index
from embedcache.store.runs import Run
from embedcache.store.verify import verify_run

if TYPE_CHECKING:
    from collections.abc import Mapping

    from embedcache.store.backend import Backend

logger = logging.getLogger(__name__)

# the suffix of a run's copy: a new name, so the old run is never touched
COPY_SUFFIX = "~v5"
_INDEX_DOC = "fences/zarr.json"


@dataclass(frozen=True, slots=True)
class Migration:
    """What ``migrate_store`` did."""

    from_version: int
    n_keys: int  # key groups flipped by this run
    n_runs: int  # their visible runs, carried over


@dataclass(frozen=True, slots=True)
class OldKey:
    """A key group of an older schema, as read (and checked) before any write."""

    digest: str
    key: ModelKey
    dim: int
    runs: tuple[CommitRecord, ...]  # the visible runs, in the order old readers served


def copy_name(run: str) -> str:
    """The name of a run's schema-5 copy."""
    return f"{run}{COPY_SUFFIX}"


def migrate_store(
    root: str | os.PathLike[str] | Any,  # noqa: ANN401 (or an obstore store)
    *,
    options: Mapping[str, str] | None = None,
) -> Migration:
    """Convert the store at ``root`` to schema 5 (nothing is recomputed).

    Raises
    ------
    CorruptStoreError
        A committed run fails its checks; nothing was written. Delete the named
        commit record (its rows will be recomputed) and run again.
    StoreError
        ``root`` is no embedcache store, or of an unknown schema, or a writer
        of an older schema holds a lease.
    """
    backend = open_backend(root, options, create=False)
    attrs = _attrs(backend.read_or_none(META), backend, META, STORE_KIND)
    version = attrs.get("schema_version")
    if version == SCHEMA_VERSION:
        return Migration(from_version=SCHEMA_VERSION, n_keys=0, n_runs=0)
    if version not in (1, 2, 3, 4):
        msg = (
            f"{backend.describe(META)} has schema_version {version!r}; migrate "
            f"converts 1, 2, 3 or 4 to {SCHEMA_VERSION}"
        )
        raise StoreError(msg)
    _refuse_old_writers(backend)
    folders, _ = backend.list_dir("")
    digests = [d for d in folders if is_key_digest(d)]
    # every key read and checked first: a refused migration writes nothing
    old_keys = {d: k for d in digests if (k := _read_old_key(backend, d)) is not None}
    _refuse_faults(backend, list(old_keys.values()))
    n_runs = 0
    for digest in digests:
        if digest in old_keys:
            _convert_key(backend, old_keys[digest])
            n_runs += len(old_keys[digest].runs)
        _clean_up_key(backend, digest)
    attrs["schema_version"] = SCHEMA_VERSION
    backend.write(META, group_doc(attrs))
    backend.sync([META])
    logger.info(
        "migrated %s to schema %d: %d keys",
        backend.location,
        SCHEMA_VERSION,
        len(old_keys),
    )
    return Migration(from_version=version, n_keys=len(old_keys), n_runs=n_runs)


def _refuse_old_writers(backend: Backend) -> None:
    """Refuse while a writer of an older schema holds a lease: it would go on
    writing the old layout into the converted store."""
    sessions, _ = backend.list_dir(LEASES)
    paths = [lease_path(s) for s in sessions]
    for path, doc in zip(paths, backend.read_many(paths), strict=True):
        if doc is None:
            continue
        try:
            version = parse_json(doc, path)["attributes"]["embedcache"][
                "schema_version"
            ]
        except (CorruptStoreError, KeyError, TypeError):
            continue  # not a lease
        if version != SCHEMA_VERSION:
            msg = (
                f"a writer of store schema {version} holds the lease "
                f"{backend.describe(path)}: migrate refuses while it may write. "
                "Run again once it has finished; if that writer is gone for good, "
                "delete the lease first."
            )
            raise StoreError(msg)


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


# --- reading and checking an old key ---------------------------------------------


def _read_old_key(backend: Backend, digest: str) -> OldKey | None:
    """The key group's runs if it is of an older schema; None if it has no group
    document or is converted already (by an interrupted migration)."""
    path = f"{digest}/{META}"
    doc = backend.read_or_none(path)
    if doc is None:
        return None
    attrs = _attrs(doc, backend, path, KEY_KIND)
    version = attrs.get("schema_version")
    if version == SCHEMA_VERSION:
        return None
    if version not in (1, 2, 3, 4):
        msg = f"{backend.describe(path)} has schema_version {version!r}"
        raise StoreError(msg)
    try:
        key = ModelKey.from_json(attrs["key_json"])
        dim = int(attrs["dim"])
    except (KeyError, TypeError, ValueError) as err:
        msg = f"{backend.describe(path)}: unreadable model key ({err})"
        raise CorruptStoreError(msg) from err
    records = old_records(backend, digest, dim, version)
    hidden = {old for r in records.values() for old in r.supersedes}
    visible = [r for name, r in records.items() if name not in hidden]
    # the order old readers served them in: what they were served stays served
    visible.sort(key=lambda r: (r.order_ns, r.run))
    return OldKey(digest=digest, key=key, dim=dim, runs=tuple(visible))


def _rebuilt(record: CommitRecord) -> bool:
    """Whether a run's sorted index is written anew (it has none of schema 4)."""
    return _INDEX_DOC not in record.files


def _refuse_faults(backend: Backend, keys: list[OldKey]) -> None:
    """CorruptStoreError naming every fault of every old key's visible runs
    (an index written anew is not looked at)."""
    found = []
    for k in keys:
        faults = [
            f
            for r in k.runs
            for f in verify_run(
                backend,
                k.digest,
                r,
                require_index=False,
                rewritten=frozenset(INDEX_ARRAYS if _rebuilt(r) else ()),
            )
        ]
        if faults:
            listed = "\n  ".join(map(str, faults))
            found.append(f"{k.key.short()} ({k.digest[:12]}):\n  {listed}")
    if not found:
        return
    msg = (
        f"faults in {len(found)} key(s); nothing was migrated (the store is as it "
        "was). Delete the named runs' commit records (their rows will be "
        "recomputed) and run again.\n" + "\n".join(found)
    )
    raise CorruptStoreError(msg)


# --- copy, verify, flip ----------------------------------------------------------


def _convert_key(backend: Backend, old: OldKey) -> None:
    """Copy the key's runs to new names, verify and publish the copies, flip."""
    renamed = {r.run: copy_name(r.run) for r in old.runs}
    copies = [_copy_run(backend, old.digest, r, renamed) for r in old.runs]
    faults = [f for r in copies for f in verify_run(backend, old.digest, r)]
    if faults:
        # the copies only: the old runs, and so the key for old readers, stand
        backend.delete_prefixes(run_prefix(old.digest, r.run) for r in copies)
        listed = "\n  ".join(map(str, faults))
        msg = (
            f"the copies of {old.key.short()}'s runs fail their checks, so the key "
            f"was not flipped (it reads as before):\n  {listed}"
        )
        raise CorruptStoreError(msg)
    _publish_copies(backend, old.digest, copies)
    path = f"{old.digest}/{META}"
    backend.write(path, group_doc(key_attrs(old.key, old.dim)))
    backend.sync([path])


def _copy_run(
    backend: Backend, digest: str, record: CommitRecord, renamed: dict[str, str]
) -> CommitRecord:
    """Copy one run under its new name (its index written anew if it had none of
    schema 4); the copy's record, as a claim (no seq)."""
    source = run_prefix(digest, record.run)
    name = renamed[record.run]
    target = run_prefix(digest, name)

    def copy(rel: str) -> None:
        data = backend.read(f"{source}/{rel}")
        if (len(data), sha256(data)) != record.files[rel]:
            msg = f"{backend.describe(f'{source}/{rel}')} changed since it was checked"
            raise CorruptStoreError(msg)
        backend.write(f"{target}/{rel}", data, sync_soon=True)

    files = dict(record.files)
    backend.map(copy, sorted(files))
    backend.sync(f"{target}/{rel}" for rel in files)
    if _rebuilt(record):
        keys = read_keys(
            backend,
            digest,
            Run(record=replace(record, run=name), prefix=target),
        )
        index = write_index(backend, target, keys)
        backend.sync(f"{target}/{rel}" for rel in index)
        files.update(index)
    return replace(
        record,
        run=name,
        files=dict(sorted(files.items())),
        supersedes=(),  # the superseded runs are not carried over
        lacks=tuple(sorted(renamed[s] for s in record.lacks if s in renamed)),
        seq=None,
        place=None,
    )


def _publish_copies(backend: Backend, digest: str, copies: list[CommitRecord]) -> None:
    """Publish the copies at ``log/1..n`` in order. Old readers never look at the
    log, and this embedcache not before the flip; an entry an interrupted run
    wrote for the same run is written again, one naming another run stops it."""
    group = group_doc({"kind": LOG_KIND, "schema_version": SCHEMA_VERSION})
    if not backend.create(f"{log_prefix(digest)}/{META}", group):
        backend.write(f"{log_prefix(digest)}/{META}", group)
    names, _ = backend.list_dir(log_prefix(digest))
    stale = sorted(int(n) for n in names if n.isdigit() and int(n) > len(copies))
    if stale:
        raise _foreign_log(backend, log_path(digest, stale[0]), "no run")
    for seq, record in enumerate(copies, 1):
        path, doc = log_path(digest, seq), replace(record, seq=seq).to_doc()
        if backend.create(path, doc):
            continue
        found = backend.read_or_none(path)
        if found is None or _run_named(found) != record.run:
            raise _foreign_log(backend, path, record.run)
        backend.write(path, doc)  # an interrupted run's, of other bytes
        backend.sync([path])


def _run_named(doc: bytes) -> str | None:
    try:
        return str(json.loads(doc)["attributes"]["embedcache"][RUN_ATTR])
    except (ValueError, KeyError, TypeError):
        return None


def _foreign_log(backend: Backend, path: str, expected: str) -> StoreError:
    msg = (
        f"{backend.describe(path)} does not name run {expected}, which this "
        "migration publishes there: another migration is running, or an earlier "
        "one saw other runs. If none is running, delete the key's log/ folder "
        "(no reader reads it before its key is flipped) and run again."
    )
    return StoreError(msg)


# --- clean up a flipped key --------------------------------------------------------


def _clean_up_key(backend: Backend, digest: str) -> None:
    """Finish a flipped key: its runs' claims and group documents written, every
    old record and run folder deleted (records first). Run again after a kill."""
    path = f"{digest}/{META}"
    doc = backend.read_or_none(path)
    if doc is None:
        return
    _, dim = parse_key_doc(doc, backend.describe(path), digest)
    names, _ = backend.list_dir(log_prefix(digest))
    entries = [log_path(digest, int(n)) for n in names if n.isdigit()]
    runs = set()
    for at, data in zip(entries, backend.read_many(entries), strict=True):
        if data is None:
            continue
        record = CommitRecord.from_doc(
            data, run=None, dim=dim, where=backend.describe(at)
        )
        _write_claim(backend, digest, replace(record, seq=None))
        runs.add(record.run)
    for folder, kind in (
        (runs_prefix(digest), RUNS_KIND),
        (commits_prefix(digest), COMMITS_KIND),
    ):
        group = group_doc({"kind": kind, "schema_version": SCHEMA_VERSION})
        if backend.read_or_none(f"{folder}/{META}") != group:
            backend.write(f"{folder}/{META}", group)
            backend.sync([f"{folder}/{META}"])
    prefix = commits_prefix(digest) + "/"
    old_records = [
        e.path
        for e in backend.list(prefix)
        if e.path[len(prefix) :].partition("/")[0] not in {*runs, META}
    ]
    backend.delete_many(old_records)
    folders, _ = backend.list_dir(runs_prefix(digest))
    old_runs = [name for name in folders if name not in runs]
    backend.delete_prefixes(run_prefix(digest, name) for name in old_runs)
    if backend.local is not None:  # empty record folders, staging leftovers
        commits, _ = backend.list_dir(commits_prefix(digest))
        backend.delete_prefixes(
            f"{commits_prefix(digest)}/{n}" for n in commits if n not in runs
        )


def _write_claim(backend: Backend, digest: str, claim: CommitRecord) -> None:
    """A copy's commit record at ``commits/<run>``: a collector's fence."""
    path = record_path(digest, claim.run)
    if backend.create(path, claim.to_doc()):
        return
    found = backend.read_or_none(path)
    if found is None or is_tombstone(found) or _run_named(found) != claim.run:
        msg = f"{backend.describe(path)} holds no claim of run {claim.run}"
        raise CorruptStoreError(msg)
