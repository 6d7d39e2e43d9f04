"""Repair: drop the published runs that fail their checks, so their rows are
recomputed rather than skipped by every reader for ever.

Readers quarantine such a run in their own process only (``snapshots``); the
store keeps publishing it until ``store repair`` deletes its log entries (readers
stop seeing it), its record and its objects, in that order (``commits.retire``).
Healthy runs are never touched: a run is dropped only if ``verify`` finds a
fault in it, and a run merged away (its rows held by the run that merged it) is
left to collection. An unparsable log entry is deleted alone: if the run it
named has a sound record, collection publishes that run again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from embedcache.errors import CorruptStoreError
from embedcache.store.commits import retire
from embedcache.store.layout import CommitRecord, log_path
from embedcache.store.snapshots import list_records
from embedcache.store.verify import verify_run

if TYPE_CHECKING:
    from collections.abc import Iterable

    from embedcache.store.backend import Backend
    from embedcache.store.snapshots import KeyView

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Broken:
    """A published run (or an unparsable log entry) that fails its checks."""

    digest: str  # the model key's
    seqs: tuple[int, ...]  # the log entries that publish it
    run: str | None  # None: the log entry itself is unreadable
    problem: str

    def __str__(self) -> str:
        what = f"run {self.run}" if self.run else f"log entry {self.seqs[0]}"
        return f"{what} of key {self.digest[:12]}: {self.problem}"


def find_broken(backend: Backend, view: KeyView) -> list[Broken]:
    """The key's published, visible runs that fail a check (``verify``: every
    object's size and sha256, the metadata, the sorted index), and its log entries
    that cannot be parsed."""
    out: list[Broken] = []
    records: dict[str, CommitRecord] = {}
    seqs: dict[str, list[int]] = {}
    for name in sorted(list_records(backend, view.digest)):
        seq = int(name)
        path = log_path(view.digest, seq)
        doc = backend.read_or_none(path)
        if doc is None:
            continue  # retired since listed
        where = backend.describe(path)
        try:
            record = CommitRecord.from_log_entry(
                doc, seq=seq, dim=view.dim, where=where
            )
        except CorruptStoreError as err:
            out.append(Broken(view.digest, (seq,), None, str(err)))
            continue
        records.setdefault(record.run, record)
        seqs.setdefault(record.run, []).append(seq)
    merged_away = {old for r in records.values() for old in r.supersedes}
    for run, record in sorted(records.items()):
        if run in merged_away:
            continue
        faults = verify_run(backend, view.digest, record)
        if faults and any(backend.exists(log_path(view.digest, q)) for q in seqs[run]):
            problem = "; ".join(str(f) for f in faults)
            out.append(Broken(view.digest, tuple(seqs[run]), run, problem))
    return out


def drop(backend: Backend, view: KeyView, broken: Iterable[Broken]) -> None:
    """Delete broken runs (log entries first, then records, then objects) and
    unparsable log entries."""
    broken = list(broken)
    runs = [b.run for b in broken if b.run is not None]
    retire(backend, view.digest, runs, sorted(q for b in broken for q in b.seqs))
    view.forget_listing()
    for b in broken:
        logger.warning("repair dropped %s", b)


def repair(
    backend: Backend, views: Iterable[KeyView], *, dry_run: bool
) -> list[Broken]:
    """Find the broken runs of each key of ``views`` and drop them (unless
    ``dry_run``); what was found."""
    found = []
    for view in views:
        broken = find_broken(backend, view)
        if broken and not dry_run:
            drop(backend, view, broken)
        found.extend(broken)
    return found
