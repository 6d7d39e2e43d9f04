"""Reads of a key's snapshot: look-ups through each run's sorted index, vectors,
hashes, and the bulk read behind a whole job's read-back.

Every function reads one :class:`~embedcache.store.snapshots.Snapshot` the caller
took; a run's object that vanished raises
:class:`~embedcache.store.snapshots.RunRetiredError` (retired meanwhile: refresh
and retry) or a :class:`CorruptStoreError` naming the run (lost: quarantine it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from embedcache.errors import CorruptStoreError
from embedcache.store.index import argsort_keys
from embedcache.store.run_reads import (
    MissingObjectError,
    corrupt,
    read_keys,
    read_rows,
)
from embedcache.store.runs import BlockCache, ChunkError, Run, probe, read_sorted
from embedcache.store.snapshots import (
    RETRIES,
    RunRetiredError,
    drop_quarantined,
    missing_or_retired,
    refresh,
    retries_exhausted,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from embedcache.store.backend import Backend
    from embedcache.store.snapshots import KeyView, Snapshot


def lookup(
    backend: Backend, view: KeyView, snap: Snapshot, q: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(run position in ``snap``, stored row) of each S32 key; -1 where absent."""
    try:
        return probe(backend, snap.runs, q, view.cache)
    except ChunkError as err:
        raise _index_error(backend, view, err, snap.runs) from None


def sorted_index(
    backend: Backend, view: KeyView, run: Run, lo: int, hi: int, cache: BlockCache
) -> tuple[np.ndarray, np.ndarray]:
    """Positions ``lo..hi`` of a run's sorted index: its hashes (S32) and the stored
    row of each (int64)."""
    try:
        return read_sorted(backend, run, lo, hi, cache)
    except ChunkError as err:
        raise _index_error(backend, view, err, [run]) from None


def _index_error(
    backend: Backend, view: KeyView, err: ChunkError, runs: Sequence[Run]
) -> Exception:
    run = err.path.split("/")[2]
    record = next((s.record for s in runs if s.record.run == run), None)
    if err.missing:
        if record is None:  # not a run of this snapshot: cannot be told apart
            return RunRetiredError(run)
        return missing_or_retired(backend, view, record, err.path)
    return corrupt(backend, err.path, err.problem, view.digest, run)


def read_vectors(
    backend: Backend,
    view: KeyView,
    snap: Snapshot,
    which: np.ndarray,
    rows: np.ndarray,
    out: np.ndarray,
    dest: np.ndarray,
) -> None:
    """out[dest] = vectors of (run ``which``, stored row ``rows``) (crc-checked)."""
    if not len(which):
        return
    order = np.argsort(which, kind="stable")
    bounds = np.flatnonzero(np.diff(which[order])) + 1
    parts = np.split(order, bounds)

    def read_part(part: np.ndarray) -> None:
        run = snap.runs[int(which[part[0]])]
        try:
            read_rows(
                backend, view.digest, run, rows[part], out, dest[part], view.cache
            )
        except MissingObjectError as err:
            raise missing_or_retired(backend, view, run.record, err.path) from None

    backend.map(read_part, parts)


# rows a bulk read resolves per look-up (in sorted order: each reads the blocks
# of its own range of hashes; a look-up holds ~240 bytes a row at its peak, so a
# 2^20-row one was a fill's peak), and bytes of vectors it reads per step
BULK_LOOKUP = 1 << 17
BULK_READ_BYTES = 1 << 24


def read_many(
    backend: Backend,
    view: KeyView,
    snap: Snapshot,
    digests: np.ndarray,
    out: np.ndarray,
) -> np.ndarray:
    """out[i] = vector of S32 ``digests[i]`` where stored; which were found.

    Linear in the rows asked plus the key's index: the digests are looked up in
    sorted order, a range of hashes at a time (each block read once), then each
    run's rows are read in stored order (each vector chunk read once). Beside
    ``out`` it holds ~20 bytes a digest, and a look-up's ~30 MiB.
    """
    n = len(digests)
    which = np.full(n, -1, np.int32)
    rows = np.zeros(n, np.int64)
    order = argsort_keys(digests)
    for lo in range(0, n, BULK_LOOKUP):
        part = order[lo : lo + BULK_LOOKUP]
        found, at = lookup(backend, view, snap, digests[part])
        which[part], rows[part] = found, at
    del order
    window = max(1, BULK_READ_BYTES // (4 * max(view.dim, 1)))
    for pos, run in enumerate(snap.runs):
        dest = np.flatnonzero(which == pos)
        dest = dest[np.argsort(rows[dest], kind="stable")]
        for lo in range(0, len(dest), window):
            part = dest[lo : lo + window]
            try:
                read_rows(backend, view.digest, run, rows[part], out, part)
            except MissingObjectError as err:
                raise missing_or_retired(backend, view, run.record, err.path) from None
    return which >= 0


def all_keys(backend: Backend, view: KeyView, snap: Snapshot) -> list[np.ndarray]:
    """Every run's hashes in stored order (a whole-key read), in commit order."""
    return backend.map(lambda s: stored_keys(backend, view, s), snap.runs)


def stored_keys(
    backend: Backend, view: KeyView, run: Run, lo: int = 0, hi: int | None = None
) -> np.ndarray:
    """The hashes of a run's stored rows ``lo..hi`` (default: all), S32."""
    try:
        return read_keys(backend, view.digest, run, lo, hi)
    except MissingObjectError as err:
        raise missing_or_retired(backend, view, run.record, err.path) from None


def absent_rows(
    backend: Backend, view: KeyView, q: np.ndarray, rows: np.ndarray
) -> tuple[np.ndarray, frozenset[str]]:
    """A put's look-up: the rows of ``q`` whose hash the (fresh) view does not
    hold, and the runs it read (none of them holds those hashes)."""
    for _ in range(RETRIES):
        snap = view.snap
        try:
            absent = lookup(backend, view, snap, q[rows])[0] < 0
        except RunRetiredError:
            view.forget_listing()
            refresh(backend, view)
            continue
        except CorruptStoreError as err:
            drop_quarantined(view, err)
            continue
        return rows[absent], frozenset(s.record.run for s in snap.runs)
    raise retries_exhausted(backend, view.key)
