"""The storage interface: every read, write, list and delete of the store, via obstore.

One :class:`Backend` wraps one obstore store rooted at the embedding store's root (a
local folder, ``s3://``, ``gs://``, ``az://`` or ``memory://``). Paths are relative to
that root and use ``/``. Credentials and endpoints come in as an explicit options
mapping (:func:`open_object_store`); this package never reads the environment.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import secrets
import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import obstore
from obstore.exceptions import (
    AlreadyExistsError,
    NotSupportedError,
    PermissionDeniedError,
)
from obstore.store import LocalStore, MemoryStore

from embedcache.errors import StoreError
from embedcache.store.retry import (
    CLIENT_DEFAULTS,
    RETRY_KEYS,
    RetryingStore,
    attempt,
    retry_config,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from obstore.store import ObjectStore

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

# obstore's URL schemes; anything else is a local path
URL_SCHEMES = frozenset(
    {"s3", "s3a", "gs", "az", "abfs", "abfss", "azure", "adl", "memory", "file"}
    | {"http", "https"}
)
# options of the HTTP client rather than of a cloud (obstore takes them separately)
_CLIENT_KEYS = frozenset(
    {
        "allow_http",
        "allow_invalid_certificates",
        "connect_timeout",
        "timeout",
        "proxy_url",
        "user_agent",
        "pool_idle_timeout",
        "pool_max_idle_per_host",
    }
)
# requests in flight at once when loading many small objects (a local folder:
# file reads and zarr's decoding overlap a little)
_REMOTE_WORKERS = 16
_LOCAL_WORKERS = 4
# started fsyncs a backend tracks before it forgets the finished ones
_PRUNE_SYNCING = 1 << 14


_IN_POOL = threading.local()  # set in the threads of a backend's kept pool


def _fsync(path: Path) -> None:
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:  # deleted meanwhile (retired): nothing to keep
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _mark_pool() -> None:
    _IN_POOL.on = True


def is_url(root: str | os.PathLike[str]) -> bool:
    """Whether ``root`` names an object store by URL (``scheme://...``)."""
    text = os.fspath(root)
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.lower() in URL_SCHEMES


def open_object_store(
    root: str | os.PathLike[str], options: Mapping[str, str] | None = None
) -> ObjectStore:
    """Build the obstore store for a path or URL and explicit options.

    Parameters
    ----------
    root
        A local folder, ``file:///...``, ``s3://bucket/prefix``, ``gs://...``,
        ``az://...`` or ``memory://`` (a new, empty in-process store).
    options
        obstore configuration, e.g. ``{"aws_region": "eu-west-1",
        "aws_endpoint_url": "http://127.0.0.1:9000", "aws_allow_http": "true"}``.
        Plain strings, so a Dask client can ship them to its workers.

    Raises
    ------
    StoreError
        The URL or an option is not understood, or a local folder does not exist.
    """
    options = dict(options or {})
    text = os.fspath(root)
    if not is_url(text) or text.lower().startswith("file://"):
        path = Path(text[len("file://") :] if is_url(text) else text)
        if options:
            msg = f"options {sorted(options)} given for the local folder {path}; a local store takes none"
            raise StoreError(msg)
        try:
            return LocalStore(path, automatic_cleanup=True)
        except Exception as err:
            msg = f"cannot open the folder {path} as a store ({err})"
            raise StoreError(msg) from err
    config: dict[str, str] = {}
    client: dict[str, str] = dict(CLIENT_DEFAULTS)
    retries: dict[str, str] = {}
    for name, value in options.items():
        bare = name.lower()
        for cloud in ("aws_", "google_", "azure_"):
            bare = bare.removeprefix(cloud)
        if bare in _CLIENT_KEYS:
            client[bare] = str(value)
        elif bare in RETRY_KEYS:
            retries[bare] = str(value)
        else:
            config[name.lower()] = str(value)
    try:
        return obstore.store.from_url(
            text,
            config=config or None,
            client_options=client,
            retry_config=retry_config(retries),  # type: ignore[arg-type]
        )
    except Exception as err:
        msg = (
            f"cannot open {text} ({str(err).splitlines()[0]}); check the URL and the "
            f"options given ({sorted(options)})"
        )
        raise StoreError(msg) from err


def describe(store: ObjectStore) -> str:
    """A printable location for an obstore store (its URL, or a folder path)."""
    if isinstance(store, LocalStore):
        return str(store.prefix)
    if isinstance(store, MemoryStore):
        return f"memory://{id(store):x}"
    config = getattr(store, "config", {}) or {}
    prefix = str(getattr(store, "prefix", None) or "").strip("/")
    scheme = {"S3Store": "s3", "GCSStore": "gs", "AzureStore": "az"}.get(
        type(store).__name__
    )
    bucket = config.get("bucket") or config.get("container_name")
    if scheme and bucket:
        return f"{scheme}://{bucket}/{prefix}".rstrip("/")
    return repr(store)


@dataclass(frozen=True, slots=True)
class Entry:
    """One object found by a listing."""

    path: str
    size: int
    modified: float  # unix seconds


class Backend:
    """Reads, writes, lists and deletes objects under one store root.

    Parameters
    ----------
    store
        An obstore store whose root (prefix) is the embedding store's root.
    location
        How to print the root in messages (a folder path or URL).
    """

    def __init__(self, store: ObjectStore, *, location: str | None = None) -> None:
        self.store = store
        self.location = location or describe(store)
        self.local: Path | None = (
            Path(store.prefix) if isinstance(store, LocalStore) else None
        )
        in_process = isinstance(store, LocalStore | MemoryStore)
        self.workers = _LOCAL_WORKERS if in_process else _REMOTE_WORKERS
        # LocalStore creates by hard link, MemoryStore under a lock: both atomic.
        # A remote server's conditional put is probed at open instead.
        self.needs_probe = not in_process
        self._in_process = in_process
        self._zarr_store: Any = None
        self._sync_pool: ThreadPoolExecutor | None = None
        # fsyncs started by write(sync_soon=True) that no sync() has waited for
        self._syncing: dict[str, Future[None]] = {}
        self._prune_at = _PRUNE_SYNCING
        self._pool: ThreadPoolExecutor | None = None

    def __repr__(self) -> str:
        return f"Backend({self.location!r})"

    def describe(self, path: str) -> str:
        """The printable location of ``path`` (a file path for a local store)."""
        if self.local is not None:
            return str(Path(self.location) / path)
        return f"{self.location.rstrip('/')}/{path}"

    # --- objects -----------------------------------------------------------------

    def _attempt(self, fn: Callable[[], T], op: str, path: str) -> T:
        """``fn()`` with transient faults retried and failures named (``retry``)."""
        # the printable path only for a message: a commit makes dozens of calls
        where = functools.partial(self.describe, path)
        return attempt(fn, location=self.location, op=op, where=where)

    def read(self, path: str) -> bytes:
        """The bytes of one object; FileNotFoundError if there is none."""
        return self._attempt(
            lambda: bytes(obstore.get(self.store, path).bytes()), "reading", path
        )

    def read_or_none(self, path: str) -> bytes | None:
        try:
            return self.read(path)
        except FileNotFoundError:
            return None

    def read_many(self, paths: Iterable[str]) -> list[bytes | None]:
        """Several objects at once (None where absent), in the order asked."""
        return self.map(self.read_or_none, paths)

    def exists(self, path: str) -> bool:
        try:
            self._attempt(lambda: obstore.head(self.store, path), "checking", path)
        except FileNotFoundError:
            return False
        return True

    def write(self, path: str, data: bytes, *, sync_soon: bool = False) -> None:
        """Write (or overwrite) one object; atomic on every backend.

        ``sync_soon``: on a local store, start its fsync at once, in the background;
        a later :meth:`sync` of it waits for that one. The disk then writes a large
        run while the rest of it is made (a 3.2 M-row merge: 8.4-8.5 s, against
        10.1-10.3 s fsyncing its ~3,700 files after the last one).
        """
        self._attempt(lambda: obstore.put(self.store, path, data), "writing", path)
        if sync_soon and self.local is not None:
            self._syncing[path] = self._syncer().submit(_fsync, self.local / path)
            if len(self._syncing) >= self._prune_at:  # a run abandoned half way
                self._prune_syncing()

    def create(self, path: str, data: bytes) -> bool:
        """Put-if-absent: write ``path`` unless it exists; True if it now holds ``data``.

        Whenever the object exists already it is read back and compared byte for
        byte: equal means this writer's own create landed (a lost answer that
        obstore, or :func:`attempt`, retried and then heard "already exists"), or
        that another writer put the very same bytes (a group document). Records
        name their writer's run and time, so another writer's never match.
        """

        def once() -> bool:
            try:
                obstore.put(self.store, path, data, mode="create")
            except AlreadyExistsError:
                found = self.read_or_none(path)
                if found == data:
                    logger.info(
                        "%s exists already and holds what this writer meant to "
                        "create: taken as its own (an answer was lost)",
                        self.describe(path),
                    )
                return found == data
            return True

        made = self._attempt(once, "committing (conditional create)", path)
        if made:
            self.sync([path])
        return made

    def delete(self, path: str) -> None:
        """Remove one object; nothing happens if it is gone already."""
        with contextlib.suppress(FileNotFoundError):
            self._attempt(lambda: obstore.delete(self.store, path), "deleting", path)

    def delete_many(self, paths: Iterable[str]) -> None:
        """Remove objects (in bulk where the backend can); missing ones are fine."""
        paths = list(paths)
        if self.local is None and paths:
            with contextlib.suppress(FileNotFoundError):
                self._attempt(
                    lambda: obstore.delete(self.store, paths),  # S3: 1,000 a request
                    "deleting",
                    paths[0],
                )
                return
        self.map(self.delete, paths)

    def delete_prefix(self, prefix: str) -> None:
        """Remove every object under ``prefix/`` (a whole folder on a local store)."""
        self.delete_prefixes([prefix])

    def delete_prefixes(self, prefixes: Iterable[str]) -> None:
        """Remove every object under each ``prefix/``; one listing per parent."""
        prefixes = [p.rstrip("/") for p in prefixes]
        if self.local is not None:
            # rmtree also takes the staging files obstore leaves behind a killed
            # writer; folders in parallel (each unlink or rmdir waits on the disk)
            with ThreadPoolExecutor(max_workers=_LOCAL_WORKERS) as pool:
                list(
                    pool.map(
                        lambda p: shutil.rmtree(self.local / p, ignore_errors=True),
                        prefixes,
                    )
                )
            return
        by_parent: dict[str, set[str]] = {}
        for prefix in prefixes:
            parent, _, name = prefix.rpartition("/")
            by_parent.setdefault(parent, set()).add(name)
        doomed = []
        for parent, names in by_parent.items():
            start = f"{parent}/" if parent else ""
            for entry in self.list(start):
                if entry.path[len(start) :].partition("/")[0] in names:
                    doomed.append(entry.path)
        self.delete_many(doomed)

    def list(self, prefix: str) -> list[Entry]:
        """Every object whose path starts with ``prefix``, sorted by path."""
        entries = self._attempt(
            lambda: [
                Entry(m["path"], int(m["size"]), m["last_modified"].timestamp())
                for batch in obstore.list(self.store, prefix or None)
                for m in batch
            ],
            "listing",
            prefix,
        )
        return sorted(entries, key=lambda e: e.path)

    def list_dir(self, prefix: str) -> tuple[list[str], list[Entry]]:
        """The child folder names and the objects directly under ``prefix``."""
        res = self._attempt(
            lambda: obstore.list_with_delimiter(self.store, prefix.rstrip("/") or None),
            "listing",
            prefix,
        )
        base = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
        dirs = sorted(p[len(base) :].rstrip("/") for p in res["common_prefixes"])
        files = [
            Entry(m["path"], int(m["size"]), m["last_modified"].timestamp())
            for m in res["objects"]
        ]
        return dirs, sorted(files, key=lambda e: e.path)

    def sync(self, paths: Iterable[str]) -> None:
        """Make written objects durable: fsync files and folders on a local store.

        Remote stores acknowledge a put only once it is durable: nothing to do.
        """
        if self.local is None:
            return
        paths = list(paths)
        started = [self._syncing.pop(p, None) for p in paths]
        files = [
            self.local / p
            for p, soon in zip(paths, started, strict=True)
            if soon is None
        ]
        # every folder up to the root: a new folder's entry must last too (string
        # prefixes: pathlib's parents cost more than the fsyncs of a small run)
        names = {""}
        for p in paths:
            parts = p.split("/")[:-1]
            names.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
        folders = [self.local / name if name else self.local for name in names]
        # fsyncs in parallel: the journal commits them together (3-10x faster than
        # one after another for the ~10 files of a small run)
        pool = self._syncer()
        list(pool.map(_fsync, files))
        for soon in started:
            if soon is not None:
                soon.result()
        list(pool.map(_fsync, folders))

    def _syncer(self) -> ThreadPoolExecutor:
        # threads kept for the backend's life: starting 8 per commit cost more than
        # the fsyncs of a small run
        if self._sync_pool is None:
            self._sync_pool = ThreadPoolExecutor(8, thread_name_prefix="fsync")
        return self._sync_pool

    def _prune_syncing(self) -> None:
        """Forget finished fsyncs no sync() waited for (a later sync of one of them
        fsyncs it again: a clean file costs little), so their count stays bounded."""
        for path, soon in list(self._syncing.items()):
            if soon.done():
                self._syncing.pop(path, None)
        self._prune_at = max(_PRUNE_SYNCING, 2 * len(self._syncing))

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """``[fn(x) for x in items]``, with requests in flight at once on a remote store.

        In process (a folder, memory) through threads kept for the backend's life
        (starting a pool a call cost more than the reads), whose own nested calls
        run inline (a worker never waits for the pool it is part of); a remote store
        starts a pool a call, so nested calls keep their requests in flight too.
        """
        items = list(items)
        if self.workers <= 1 or len(items) <= 1 or getattr(_IN_POOL, "on", False):
            return [fn(x) for x in items]
        if not self._in_process:
            with ThreadPoolExecutor(max_workers=min(self.workers, len(items))) as pool:
                return list(pool.map(fn, items))
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                self.workers, thread_name_prefix="store", initializer=_mark_pool
            )
        return list(self._pool.map(fn, items))

    def zarr_store(self) -> Any:  # noqa: ANN401 (a zarr.storage.ObjectStore)
        """This store as zarr sees it, for array I/O."""
        if self._zarr_store is None:
            from embedcache.store.zarr_objects import ThreadedObjectStore

            self._zarr_store = RetryingStore(
                ThreadedObjectStore(self.store),
                describe=self.describe,
                location=self.location,
            )
        return self._zarr_store

    # --- capabilities -----------------------------------------------------------

    def probe_put_if_absent(self) -> bool:
        """Check that a second create of one object is refused.

        Returns False if the credentials may not write at all (the store is then
        read-only); raises StoreError if writes work but put-if-absent does not.
        """
        path = f".embedcache-probe-{secrets.token_hex(8)}"
        try:
            self.create(path, b"1")
        except PermissionDeniedError:
            logger.info("no write permission at %s: opened read-only", self.location)
            return False
        except NotSupportedError as err:
            raise self._no_create(err) from err
        try:
            self._attempt(
                lambda: obstore.put(self.store, path, b"2", mode="create"),
                "probing put-if-absent at",
                path,
            )
        except AlreadyExistsError:
            return True
        except NotSupportedError as err:
            raise self._no_create(err) from err
        finally:
            self.delete(path)
        why = "a second create of one object overwrote it"
        raise self._no_create(why)

    def _no_create(self, why: object) -> StoreError:
        msg = (
            f"{self.location} does not support put-if-absent (conditional create: "
            f"{why}). The store's commit protocol needs it to stay safe with several "
            "writers; use a backend that honours `If-None-Match: *` (AWS S3, GCS, "
            "Azure, MinIO, recent Ceph) or a local folder."
        )
        return StoreError(msg)
