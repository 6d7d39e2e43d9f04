"""EmbeddingStore: the public face of the store (get, contains, put, keys, verify, compact)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import threading
import weakref
from typing import TYPE_CHECKING, Any, Self, TypeVar

import numpy as np

from embedcache.errors import CorruptStoreError, DimensionMismatchError, StoreError
from embedcache.store import collection, merges, repair
from embedcache.store.commits import Writer, commit_run
from embedcache.store.counts import KeyInfo, n_distinct
from embedcache.store.groups import list_keys, open_backend, open_key, open_root
from embedcache.store.index import check_hashes, first_rows, to_hex
from embedcache.store.inputs import check_alias, check_vectors
from embedcache.store.layout import HOST, new_session_name
from embedcache.store.lease import Lease, LeasePolicy
from embedcache.store.reads import (
    absent_rows,
    all_keys,
    lookup,
    read_many,
    read_vectors,
)
from embedcache.store.run_writes import rows_in_hand
from embedcache.store.runs import BlockCache
from embedcache.store.snapshots import (
    RETRIES,
    KeyView,
    RunRetiredError,
    Snapshot,
    adopt,
    drop_quarantined,
    refresh,
    retries_exhausted,
)
from embedcache.store.verify import Fault, verify_store

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence

    from embedcache.specs import ModelKey

logger = logging.getLogger(__name__)
T = TypeVar("T")

# default staleness of a look-up's view of other processes' commits (seconds)
REFRESH_SECONDS = 1.0
_WRITER_RE = re.compile(r"[A-Za-z0-9_.-]{1,80}")


class EmbeddingStore:
    """Embeddings keyed by model key and sequence hash, in a folder or a bucket.

    Parameters
    ----------
    root
        A folder, a URL (``s3://bucket/prefix``, ``gs://...``, ``az://...``,
        ``memory://``) or an obstore store object. A folder is created (with the
        store's root group) if missing and ``create``.
    writer_id
        Names this writer's runs; default ``<host>-<pid>-<random>``.
    create
        Whether a missing or empty location becomes a new store.
    auto_merge
        After each put, merge the key's runs (any writer's: a run's level is in
        its record) once this many are visible at one level (0 turns it off).
    options
        obstore options for a URL (credentials, region, endpoint, ``allow_http``);
        see :func:`embedcache.store.open_object_store`.
    refresh_seconds
        How stale a look-up's view of another process's commits may be: the
        commit records are listed again at most this often (0: at every look-up).
        On a local folder an unchanged commits folder (its mtime) also keeps the
        view current, so other writers' commits show at once there. This
        process's own commits show at once everywhere.
    lease
        This writer's lease and the garbage collector's margin (see
        :mod:`embedcache.store.lease`); default 60 s, renewed every 20 s, 5 min.

    Raises
    ------
    StoreError
        The location is not an embedcache store, was written with another schema,
        or its backend cannot do put-if-absent.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | Any,  # noqa: ANN401 (or an obstore store)
        *,
        writer_id: str | None = None,
        create: bool = True,
        auto_merge: int = merges.AUTO_MERGE,
        options: Mapping[str, str] | None = None,
        refresh_seconds: float = REFRESH_SECONDS,
        lease: LeasePolicy | None = None,
    ) -> None:
        if writer_id is None:
            writer_id = f"{HOST}-{os.getpid()}-{secrets.token_hex(3)}"
        if not _WRITER_RE.fullmatch(writer_id):
            msg = (
                f"writer_id {writer_id!r} must be 1-80 characters of letters, digits, "
                "'_', '.', '-'"
            )
            raise ValueError(msg)
        self.writer_id = writer_id
        self._backend = open_backend(root, options, create=create)
        self.root = self._backend.location
        if not refresh_seconds >= 0:
            msg = f"refresh_seconds must be a number of seconds >= 0, got {refresh_seconds!r}"
            raise ValueError(msg)
        self.refresh_seconds = float(refresh_seconds)
        session = new_session_name(writer_id)
        policy = LeasePolicy() if lease is None else lease
        self._writer = Writer(
            writer_id,
            Lease(self._backend, session, writer_id, policy),
            grace_seconds=self.refresh_seconds + policy.margin_seconds,
        )
        # the lease goes when the store does, or at exit, if close() was not called
        self._closer = weakref.finalize(self, self._writer.close_when_dropped)
        self._auto_merge = auto_merge
        # writers (put, compact) take _lock; readers take only _views_lock, for the
        # moment of finding a key's view, then read the view's immutable snapshot
        self._lock = threading.RLock()
        self._views_lock = threading.Lock()
        self._committing = 0  # puts and compactions under way (under _lock)
        self._cache = BlockCache()
        self._views: dict[ModelKey, KeyView] = {}  # by key: no digest per call
        self._writable = open_root(self._backend, create=create)

    def __repr__(self) -> str:
        return f"EmbeddingStore({self.root!r}, writer_id={self.writer_id!r})"

    def close(self) -> None:
        """Delete this writer's lease (the store stays usable; a new put takes one)."""
        self._writer.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- reading ----------------------------------------------------------------

    def get(
        self, key: ModelKey, hashes: Sequence[str]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Vectors for ``hashes`` in the requested order, and which were found.

        Returns float32 (n, dim) vectors (rows of missing hashes are NaN; a key
        absent from the store gives shape (n, 0)) and a bool (n,) mask. Reads only
        the index blocks and vector chunks that hold the asked hashes.

        Raises
        ------
        CorruptStoreError
            A run fails a check (metadata sha256, chunk crc32c, missing object);
            no data is returned.
        """
        q = check_hashes(hashes)

        def read(view: KeyView, snap: Snapshot) -> tuple[np.ndarray, np.ndarray]:
            which, rows = lookup(self._backend, view, snap, q)
            found = which >= 0
            out = np.empty((len(q), view.dim), np.float32)
            out[~found] = np.nan
            hit = np.flatnonzero(found)
            read_vectors(self._backend, view, snap, which[hit], rows[hit], out, hit)
            return out, found

        absent = (np.empty((len(q), 0), np.float32), np.zeros(len(q), bool))
        return self._read(key, read, absent=absent)

    def contains(self, key: ModelKey, hashes: Sequence[str]) -> np.ndarray:
        """Which hashes have a stored vector (bool (n,)), without reading vectors."""
        q = check_hashes(hashes)

        def read(view: KeyView, snap: Snapshot) -> np.ndarray:
            return lookup(self._backend, view, snap, q)[0] >= 0

        return self._read(key, read, absent=np.zeros(len(q), bool))

    def read_into(
        self, key: ModelKey, digests: np.ndarray, out: np.ndarray
    ) -> np.ndarray:
        """``out[i]`` = the vector of raw sha256 ``digests[i]`` ((n,) S32); found mask.

        The bulk read behind a whole job's read-back: time linear in the rows asked
        and the key's size, and beside ``out`` ~20 bytes a digest (see
        :func:`~embedcache.store.reads.read_many`). Rows not found are left as
        they were. ``out`` is float32 (n, dim) and C-contiguous.
        """
        q = np.ascontiguousarray(digests, "S32")

        def read(view: KeyView, snap: Snapshot) -> np.ndarray:
            if out.shape != (len(q), view.dim) or out.dtype != np.float32:
                msg = (
                    f"read_into: out has shape {out.shape} {out.dtype}; expected "
                    f"({len(q)}, {view.dim}) float32 for {key.short()}"
                )
                raise DimensionMismatchError(msg)
            return read_many(self._backend, view, snap, q, out)

        return self._read(key, read, absent=np.zeros(len(q), bool))

    def hashes(self, key: ModelKey) -> list[str]:
        """Every hash stored for ``key`` (sorted), e.g. to export the whole key.

        A whole-key read: every run's hashes, sequentially.
        """

        def read(view: KeyView, snap: Snapshot) -> list[str]:
            parts = all_keys(self._backend, view, snap)
            keys = np.concatenate(parts) if parts else np.empty(0, "S32")
            return to_hex(np.unique(keys))

        return self._read(key, read, absent=[], max_age=0.0)

    def refresh(self, key: ModelKey | None = None) -> None:
        """List the commit records again now (of ``key``, or of every open key).

        Look-ups refresh on their own every ``refresh_seconds``; call this after
        another process committed something this one must see at once.
        """
        with self._views_lock:
            views = (
                list(self._views.values())
                if key is None
                else [v for v in (self._views.get(key),) if v is not None]
            )
        for view in views:
            view.forget_listing()
            refresh(self._backend, view)

    def keys(self) -> list[KeyInfo]:
        """Every model key in the store with its counts, size and aliases, by digest."""
        out = []
        for view in self._all_views():
            snap = view.snap
            out.append(
                KeyInfo(
                    key=view.key,
                    digest=view.digest,
                    n_vectors=self._n_distinct(view, snap),
                    dim=view.dim,
                    n_runs=len(snap.runs),
                    nbytes=sum(s.record.nbytes() for s in snap.runs),
                    aliases=view.aliases,
                    kernels=view.kernels,
                )
            )
        return out

    @property
    def n_quarantined(self) -> int:
        """Runs this process stopped serving because they failed their checks
        (their rows read as absent): for the service's metrics."""
        with self._views_lock:
            return sum(len(v.quarantined) for v in self._views.values())

    def _n_distinct(self, view: KeyView, snap: Snapshot) -> int:
        """Distinct hashes of the key: from its records where they tell, else a
        merge of the runs that may share hashes (``counts``)."""
        for _ in range(RETRIES):
            try:
                return n_distinct(self._backend, view, snap)
            except RunRetiredError:  # compacted meanwhile: fewer runs now
                view.forget_listing()
                snap = refresh(self._backend, view)
        raise retries_exhausted(self._backend, view.key)

    # --- writing ----------------------------------------------------------------

    def put(
        self,
        key: ModelKey,
        hashes: Sequence[str],
        vectors: np.ndarray,
        *,
        alias: str | None = None,
        kernels: Mapping[str, str] | None = None,
    ) -> int:
        """Store vectors not stored yet, as one atomic commit; return how many.

        Idempotent: hashes already stored (or repeated within the call) are skipped,
        their new vectors ignored (the first committed vector wins). ``alias`` (e.g.
        a local model's folder name) is recorded in the commit; if every vector is
        stored already and the key does not list the alias yet, an empty commit
        records it. ``kernels`` (what computed the vectors: kernel choices, CPU
        kind, library versions) is recorded in the commit; never part of the key.

        Raises
        ------
        DimensionMismatchError
            ``vectors`` is not (len(hashes), dim) floating point, or dim disagrees
            with the key's group. Nothing is written.
        InvalidVectorError
            A vector is not finite in float32. Nothing is written.
        """
        q = check_hashes(hashes)
        vecs = check_vectors(key, len(q), vectors)
        aliases = (check_alias(alias),) if alias is not None else ()
        if not len(q):
            return 0
        with self._committing_lock():
            self._check_writable()
            found_view = self._snapshot(key, max_age=0.0, create_dim=vecs.shape[1])
            assert found_view is not None  # created above when absent
            view = found_view[0]
            if view.dim != vecs.shape[1]:
                msg = (
                    f"vectors of dim {vecs.shape[1]} for {key.short()} (key "
                    f"{view.digest[:12]}), but {self._backend.describe(view.digest)} "
                    f"holds dim {view.dim}. Nothing was written. Vectors of another dim "
                    "belong to another model key (check layer, rc_mode and adapter "
                    "options)."
                )
                raise DimensionMismatchError(msg)
            # first occurrence of each hash not stored yet, in the caller's order
            rows = np.sort(first_rows(q))
            rows, looked_in = absent_rows(self._backend, view, q, rows)
            if not len(rows) and set(aliases) <= set(view.aliases):
                return 0
            new = vecs if len(rows) == len(vecs) else vecs[rows]  # all new: no copy
            run = commit_run(
                self._backend,
                view,
                self._writer,
                rows_in_hand(q[rows], new),
                aliases=aliases,
                lacks=looked_in,
                kernels=(json.dumps(dict(kernels), sort_keys=True),) if kernels else (),
            )
            logger.debug("committed %d rows for %s as %s", len(rows), key.short(), run)
            adopt(view, run)
            # best effort, both: the put stands whatever they meet
            merges.merge_levels(
                self._backend, view, self._writer, fan_in=self._auto_merge
            )
            collection.retire_merged(self._backend, view, self._writer)
            return len(rows)

    def compact(self, key: ModelKey | None = None) -> None:
        """Merge each key's runs into one, atomically, dropping duplicate rows.

        The merged run is committed (superseding the old ones) before any old run
        is retired, so a crash at any point leaves a readable store with every row.
        Also removes garbage that is provably dead (see ``garbage()``).
        """
        with self._committing_lock():
            self._check_writable()
            if key is None:
                views = self._all_views()
            else:
                found_view = self._snapshot(key, max_age=0.0)
                views = [] if found_view is None else [found_view[0]]
            for view in views:
                if view is not None:
                    merges.compact(self._backend, view, self._writer)

    # --- checking ---------------------------------------------------------------

    def verify(self) -> list[Fault]:
        """Full check: every committed object's size and sha256, and the metadata.

        Returns the faults found (``[]`` means healthy). Uncommitted leftovers of
        killed writers and superseded runs awaiting removal are *garbage*, not
        faults: readers never look at them; see ``garbage()``.
        """
        return verify_store(self._backend)

    def garbage(self) -> list[str]:
        """Locations readers ignore: uncommitted runs, and runs merged away whose
        grace (readers of an older snapshot) this process has seen run out."""
        with self._lock:
            out = []
            for view in self._all_views():
                for leftover in collection.find_garbage(
                    self._backend, view, self._writer
                ):
                    if not leftover.in_grace:
                        out.extend(self._backend.describe(p) for p in leftover.paths)
            return sorted(out)

    def collect(self, key_prefix: str | None = None) -> list[str]:
        """Collect the garbage of every key (or those whose digest starts with
        ``key_prefix``) and the leases this store has watched sit still long
        enough on its own clock (``collection``); the runs removed. A first call
        removes little: ``embedcache store collect --watch`` calls it on and on."""
        with self._committing_lock():
            self._check_writable()
            views = self._all_views(key_prefix)
            return collection.collect_pass(self._backend, views, self._writer)

    def repair(
        self, key_prefix: str | None = None, *, dry_run: bool = False
    ) -> list[repair.Broken]:
        """Drop the published runs that fail their checks (the ones readers
        quarantine), of every key or of those whose digest starts with
        ``key_prefix``: their rows read as absent, and the next embed computes
        them again. Healthy runs are never touched. Returns what was dropped
        (with ``dry_run``: what would be, and nothing is)."""
        with self._committing_lock():
            if not dry_run:
                self._check_writable()
            views = self._all_views(key_prefix)
            return repair.repair(self._backend, views, dry_run=dry_run)

    # --- opening ----------------------------------------------------------------

    def _read(
        self,
        key: ModelKey,
        read: Callable[[KeyView, Snapshot], T],
        *,
        absent: T,
        max_age: float | None = None,
    ) -> T:
        """``read`` of the key's snapshot (``absent`` if there is no such key),
        again on a fresh one when a run was retired under it (merged away by
        another process) or without a run that failed its checks."""
        max_age = self.refresh_seconds if max_age is None else max_age
        for _ in range(RETRIES):
            found_view = self._snapshot(key, max_age=max_age)
            if found_view is None:
                return absent
            view, snap = found_view
            try:
                return read(view, snap)
            except RunRetiredError:
                view.forget_listing()
                max_age = 0.0
            except CorruptStoreError as err:
                drop_quarantined(view, err)
        raise retries_exhausted(self._backend, key)

    @contextlib.contextmanager
    def _committing_lock(self) -> Iterator[None]:
        with self._lock:
            self._committing += 1
            try:
                yield
            finally:
                self._committing -= 1

    def _check_writable(self) -> None:
        if not self._writable:
            msg = (
                f"{self.root} was opened read-only (the credentials may not write "
                "there); use credentials with write access to add or compact"
            )
            raise StoreError(msg)

    def _snapshot(
        self, key: ModelKey, *, max_age: float, create_dim: int | None = None
    ) -> tuple[KeyView, Snapshot] | None:
        """A key's view and its state, no older than ``max_age`` seconds.

        None if the key is absent (created if ``create_dim``). While this process
        commits, a reader skips a local folder's change check: the committing
        thread lists the records at each commit, and a reader's every syscall is a
        wait for the GIL that thread holds.
        """
        with self._views_lock:
            view = self._views.get(key)
        if view is None:
            view = open_key(self._backend, key, create_dim=create_dim)
            if view is None:
                return None
            view.cache = self._cache
            with self._views_lock:
                view = self._views.setdefault(key, view)
        check = not self._committing
        return view, refresh(self._backend, view, max_age=max_age, check_folder=check)

    def _view(self, key: ModelKey) -> KeyView | None:
        """The fresh view of ``key`` (None if absent), for checks and tools."""
        found_view = self._snapshot(key, max_age=0.0)
        return None if found_view is None else found_view[0]

    def _all_views(self, key_prefix: str | None = None) -> list[KeyView]:
        """Fresh views of every key, or of those whose digest starts so."""
        keys = list_keys(self._backend)
        found = (
            self._snapshot(key, max_age=0.0)
            for key in keys
            if key_prefix is None or key.digest.startswith(key_prefix)
        )
        return [f[0] for f in found if f is not None]
