"""The commit protocol: publish a shard with put-if-absent, retire superseded ones.

A writer fills a new shard completely, makes it durable, then creates the shard's
commit record with put-if-absent. Nothing is renamed and nothing is read, changed
and written back. Readers list the commit records and trust only the shards they
name (:mod:`embedcache.store.views`); a record names the shards it supersedes
(compaction), which readers then hide. Retiring deletes the records first and the
shards after, so a reader that finds an object missing can tell a retired shard
(record gone) from a lost one.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from embedcache.errors import StoreError
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
from embedcache.store.shard_writes import write_shard
from embedcache.store.shards import Shard

if TYPE_CHECKING:
    from collections.abc import Iterable

    from embedcache.store.backend import Backend
    from embedcache.store.lease import Lease
    from embedcache.store.shard_writes import ShardRows
    from embedcache.store.views import KeyView


# a record names at most this many runs its shard lacks, the largest: a key of
# many runs would otherwise hold records that grow with the square of its runs
MAX_LACKS = 256


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
    rows: ShardRows,
    *,
    supersedes: Iterable[str] = (),
    order_ns: int | None = None,
    aliases: Iterable[str] = (),
    lacks: Iterable[str] = (),
) -> Shard:
    """Write a complete shard, make it durable, then publish it with put-if-absent.

    ``lacks``: shards known to hold none of its hashes (``CommitRecord.lacks``).

    The shard returned holds its fences and filter (for ``views.adopt``), not its
    hashes.
    """
    shard = new_shard_name(writer.lease.name)
    prefix = shard_prefix(view.digest, shard)
    path = record_path(view.digest, shard)
    writer.lease.hold()  # before the first object: a collector sees a live writer
    writer.writing.add(shard)
    try:
        files, vectors, fences, bloom = write_shard(
            backend,
            prefix,
            attrs=writer.owner_attrs(),
            dim=view.dim,
            rows=rows,
        )
        backend.sync(f"{prefix}/{rel}" for rel in files)
        now = time.time_ns()
        record = CommitRecord(
            shard=shard,
            writer=writer.writer_id,
            n_rows=rows.n,
            dim=view.dim,
            order_ns=now if order_ns is None else order_ns,
            committed_ns=now,
            supersedes=tuple(sorted(supersedes)),
            aliases=tuple(sorted(set(aliases))),
            files=files,
            lacks=_largest(set(lacks), view),
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
    return Shard(
        record=record,
        prefix=prefix,
        vectors=vectors,
        fences=fences,
        bloom=bloom,
    )


def _largest(names: set[str], view: KeyView) -> tuple[str, ...]:
    """At most :data:`MAX_LACKS` of ``names``, the runs of the most rows first
    (names the view no longer holds last), sorted."""
    if len(names) > MAX_LACKS:
        records = view.snap.records
        rows = {n: records[n].n_rows if n in records else -1 for n in names}
        names = set(sorted(names, key=lambda n: (-rows[n], n))[:MAX_LACKS])
    return tuple(sorted(names))


def _lapsed(backend: Backend, writer: Writer, prefix: str) -> StoreError:
    msg = (
        f"the lease of writer {writer.lease.name} was not renewed for "
        f"{writer.lease.policy.seconds:g} s while it wrote {backend.describe(prefix)}, "
        "so garbage collection may have removed the shard; it was not committed. "
        "Run again when the store answers: only the missing vectors are computed."
    )
    return StoreError(msg)


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
