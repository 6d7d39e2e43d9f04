"""The commit protocol: publish a shard with put-if-absent, list what is committed.

A writer fills a new shard completely, makes it durable, then creates the shard's
commit record with put-if-absent. Nothing is renamed and nothing is read, changed
and written back. Readers list the commit records and trust only the shards they
name; a record names the shards it supersedes (compaction), which readers then
hide. Retiring deletes the records first and the shards after, so a reader that
finds an object missing can tell a retired shard (record gone) from a lost one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from embedcache.errors import StoreError
from embedcache.store.index import HashIndex
from embedcache.store.layout import (
    HOST,
    SCHEMA_VERSION,
    SHARD_KIND,
    CommitRecord,
    commits_prefix,
    new_shard_name,
    record_path,
    shard_prefix,
)
from embedcache.store.shards import (
    MissingObjectError,
    Shard,
    corrupt,
    open_shard,
    read_rows,
    write_shard,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from embedcache.specs import ModelKey
    from embedcache.store.backend import Backend
    from embedcache.store.lease import Lease

logger = logging.getLogger(__name__)

RETRIES = 5


class ShardRetiredError(Exception):
    """A shard vanished because another process retired it; refresh and retry."""


@dataclass(slots=True)
class KeyView:
    """What one process knows of a model key: its records and visible shards."""

    key: ModelKey
    digest: str
    dim: int
    listing: frozenset[str] | None = None
    records: dict[str, CommitRecord] = field(default_factory=dict)
    hidden: dict[str, str] = field(default_factory=dict)  # superseded -> superseder
    shards: list[Shard] = field(default_factory=list)  # visible, in commit order
    index: HashIndex = field(default_factory=lambda: HashIndex.build([]))

    @property
    def aliases(self) -> tuple[str, ...]:
        return tuple(sorted({a for s in self.shards for a in s.record.aliases}))

    def forget_listing(self) -> None:
        self.listing = None


def list_records(backend: Backend, digest: str) -> frozenset[str]:
    """Names of the shards with (or just getting) a commit record under the key.

    One directory listing, not a walk: a record folder whose ``zarr.json`` is not
    there (yet) is skipped when its record is read.
    """
    folders, _ = backend.list_dir(commits_prefix(digest))
    return frozenset(folders)


def missing_or_retired(
    backend: Backend, digest: str, shard: str, path: str
) -> Exception:
    """A committed shard lacks ``path``: retired if its record is gone, else lost."""
    if not backend.exists(record_path(digest, shard)):
        return ShardRetiredError(shard)
    return corrupt(backend, path, "object is missing", digest, shard)


def refresh(backend: Backend, view: KeyView) -> None:
    """Bring the view up to the committed shards in the store."""
    for _ in range(RETRIES):
        names = list_records(backend, view.digest)
        if names == view.listing:
            return
        try:
            _rebuild(backend, view, names)
        except ShardRetiredError:
            continue
        return
    raise retries_exhausted(backend, view.key)


def _rebuild(backend: Backend, view: KeyView, names: frozenset[str]) -> None:
    records = {n: view.records[n] for n in names if n in view.records}
    new = sorted(names - records.keys())
    docs = backend.read_many(record_path(view.digest, n) for n in new)
    for name, doc in zip(new, docs, strict=True):
        if doc is None:
            continue  # retired since listed
        where = backend.describe(record_path(view.digest, name))
        records[name] = CommitRecord.from_doc(
            doc, shard=name, dim=view.dim, where=where
        )
    hidden: dict[str, str] = {}
    for record in sorted(records.values(), key=lambda r: r.shard):
        for old in record.supersedes:
            if old in records:
                hidden.setdefault(old, record.shard)
    visible = sorted(
        (r for s, r in records.items() if s not in hidden),
        key=lambda r: (r.order_ns, r.shard),
    )
    loaded = {s.record.shard: s for s in view.shards}

    def load(record: CommitRecord) -> Shard:
        try:
            return open_shard(backend, view.digest, record)
        except MissingObjectError as err:
            raise missing_or_retired(
                backend, view.digest, record.shard, err.path
            ) from None

    opened = backend.map(load, [r for r in visible if r.shard not in loaded])
    loaded.update((s.record.shard, s) for s in opened)
    view.shards = [loaded[r.shard] for r in visible]
    view.records, view.hidden = records, hidden
    view.index = HashIndex.build([s.keys for s in view.shards])
    # names without a record (being created, or retired since listed) are left
    # out, so the next listing differs and reads them again
    view.listing = frozenset(records)


def read_gids(
    backend: Backend, view: KeyView, gids: np.ndarray, out: np.ndarray, dest: np.ndarray
) -> None:
    """out[dest] = vectors of global rows ``gids`` of the view (crc-checked)."""
    parts = view.index.by_shard(gids)

    def run(part: tuple[int, np.ndarray, np.ndarray]) -> None:
        pos, which, rows = part
        shard = view.shards[pos]
        try:
            read_rows(backend, view.digest, shard, rows, out, dest[which])
        except MissingObjectError as err:
            raise missing_or_retired(
                backend, view.digest, shard.record.shard, err.path
            ) from None

    backend.map(run, parts)


@dataclass(slots=True)
class Writer:
    """Who writes: names this session's shards, holds its lease while it writes them,
    and remembers those in progress."""

    writer_id: str
    lease: Lease
    writing: set[str] = field(default_factory=set)

    def owner_attrs(self) -> dict[str, Any]:
        return {
            "kind": SHARD_KIND,
            "schema_version": SCHEMA_VERSION,
            "writer": self.writer_id,
            "session": self.lease.name,
            "host": HOST,
            "pid": os.getpid(),
            "created_ns": time.time_ns(),
        }


def commit_shard(
    backend: Backend,
    view: KeyView,
    writer: Writer,
    keys: np.ndarray,
    fill: Callable[[Any], None],
    *,
    supersedes: Iterable[str] = (),
    order_ns: int | None = None,
    aliases: Iterable[str] = (),
) -> Shard:
    """Write a complete shard, make it durable, then publish it with put-if-absent."""
    shard = new_shard_name(writer.lease.name)
    prefix = shard_prefix(view.digest, shard)
    path = record_path(view.digest, shard)
    writer.lease.hold()  # before the first object: a collector sees a live writer
    writer.writing.add(shard)
    try:
        files, vectors = write_shard(
            backend,
            prefix,
            attrs=writer.owner_attrs(),
            keys=keys,
            dim=view.dim,
            fill=fill,
        )
        backend.sync(f"{prefix}/{rel}" for rel in files)
        now = time.time_ns()
        record = CommitRecord(
            shard=shard,
            writer=writer.writer_id,
            n_rows=len(keys),
            dim=view.dim,
            order_ns=now if order_ns is None else order_ns,
            committed_ns=now,
            supersedes=tuple(sorted(supersedes)),
            aliases=tuple(sorted(set(aliases))),
            files=files,
        )
        if writer.lease.lapsed():
            raise _lapsed(backend, writer, prefix)
        if not backend.create(path, record.to_doc()):
            # shard names carry 48 random bits: only a reused name gets here, and
            # the objects under it may be the winner's, so they are left alone
            msg = (
                f"{backend.describe(path)} exists already: another writer committed "
                f"a shard of the same name. Give each writer its own writer_id."
            )
            raise StoreError(msg)
    except BaseException:
        _drop_uncommitted(backend, prefix, path)
        raise
    finally:
        writer.writing.discard(shard)
        writer.lease.release()
    return Shard(record=record, prefix=prefix, keys=keys, vectors=vectors)


def _lapsed(backend: Backend, writer: Writer, prefix: str) -> StoreError:
    msg = (
        f"the lease of writer {writer.lease.name} was not renewed for "
        f"{writer.lease.policy.seconds:g} s while it wrote {backend.describe(prefix)}, "
        "so garbage collection may have removed the shard; it was not committed. "
        "Run again when the store answers: only the missing vectors are computed."
    )
    return StoreError(msg)


def adopt(view: KeyView, shard: Shard) -> None:
    """Add a shard this process just committed to the view, without reading it back."""
    view.records[shard.record.shard] = shard.record
    view.shards = sorted(
        [*view.shards, shard], key=lambda s: (s.record.order_ns, s.record.shard)
    )
    view.index = HashIndex.build([s.keys for s in view.shards])
    if view.listing is not None:
        view.listing = view.listing | {shard.record.shard}


def _drop_uncommitted(backend: Backend, prefix: str, path: str) -> None:
    """Remove a shard whose commit failed, unless its record made it after all."""
    with contextlib.suppress(Exception):
        if not backend.exists(path):
            backend.delete_prefix(prefix)


def retire(backend: Backend, digest: str, shards: Iterable[str]) -> None:
    """Delete superseded shards: every record first, then the objects."""
    shards = list(shards)
    backend.delete_many(record_path(digest, shard) for shard in shards)
    backend.delete_prefixes(shard_prefix(digest, shard) for shard in shards)
    if backend.local is not None:  # a record folder may hold staging leftovers
        backend.delete_prefixes(f"{commits_prefix(digest)}/{s}" for s in shards)


def retries_exhausted(backend: Backend, key: ModelKey) -> StoreError:
    msg = (
        f"shards of {key.short()} kept vanishing while reading {backend.location}: "
        "another process is compacting it; retry when it is done"
    )
    return StoreError(msg)
