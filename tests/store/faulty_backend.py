"""A shared in-memory object store seen by several simulated hosts, with faults.

A :class:`World` holds one obstore ``MemoryStore`` (the bucket) and a clock the test
moves by hand. Each :class:`Host` is a process on a machine of its own: it opens an
:class:`~embedcache.store.EmbeddingStore` on the world through its own handle, with
its own clock offset, and its own faults:

- ``pause(...)``: block the host's next matching request (before it reaches the
  bucket, or after it landed) until the test releases it;
- ``kill_after(k)``: the k-th write (put or delete) lands, then the host is dead:
  that request and every later one raise :class:`Killed`, a ``BaseException`` no
  ``except Exception`` catches, so the writer stops where it stands;
- ``lose_answer(...)``: a matching write lands, then the caller gets a network
  error instead of the answer;
- ``lag_list(hide_newest=n)`` / ``stale_list(calls=n)``: its LISTs hide the objects
  created by the bucket's last ``n`` writes, or answer the listing taken now for
  the next ``n`` LISTs (objects deleted since still listed, new ones hidden).

The store reaches a bucket only through six obstore functions (``get``, ``head``,
``put``, ``delete``, ``list``, ``list_with_delimiter``), looked up on the ``obstore``
module at each call; :func:`installed` swaps them for dispatchers that route a
:class:`Host` handle to its world (any other store is passed straight through). A
host's handle is a ``MemoryStore`` subclass, so the store treats it as the
in-process backend it is; its own (empty) contents are never used.

Object times (``last_modified``) are the world's clock when the object was written:
the bucket's clock, which no host's offset changes.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fnmatch
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

import obstore
from obstore.exceptions import GenericError
from obstore.store import MemoryStore

from embedcache.store import EmbeddingStore, LeasePolicy

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

# the data arrays of a run: what a reader reads beyond commit records and leases
DATA_ARRAYS = ("vectors", "hashes", "sorted_hashes", "sorted_rows", "fences", "bloom")
# how long a test waits for a thread to reach a pause or finish (a hang is a bug)
WAIT_S = 30.0
# a lease's background renewal waits this share of the lease in real seconds (a
# minute): never within a test, so renewals happen only where the store asks
QUIET_RENEW = 0.99


class Killed(BaseException):
    """The host's process was killed: it makes no further request."""


@dataclass(frozen=True, slots=True)
class Request:
    """One request a host makes of the bucket."""

    op: str  # "get" | "head" | "put" | "create" | "delete" | "list"
    path: str
    thread: str

    @property
    def is_write(self) -> bool:
        return self.op in ("put", "create", "delete")

    def is_data(self) -> bool:
        """A request for an object of a run's data arrays."""
        return any(f"/{name}/" in f"/{self.path}" for name in DATA_ARRAYS)


def op_is(*ops: str, pattern: str = "*") -> Callable[[Request], bool]:
    """A matcher: the request is one of ``ops`` on a path matching ``pattern``."""
    return lambda r: r.op in ops and fnmatch.fnmatchcase(r.path, pattern)


def data_read(r: Request) -> bool:
    """A matcher: a read of a run's data (not a record, a lease or a group)."""
    return r.op == "get" and r.is_data()


class Pause:
    """Blocks the first matching request of a host until :meth:`release`.

    ``after``: the request reaches the bucket first (the write landed), then the
    caller waits. :meth:`release` with ``kill`` kills the host there instead.
    """

    def __init__(self, match: Callable[[Request], bool], *, after: bool) -> None:
        self.match = match
        self.after = after
        self.request: Request | None = None
        self._reached = threading.Event()
        self._go = threading.Event()
        self._kill = False

    @property
    def reached(self) -> bool:
        return self._reached.is_set()

    def wait(self, timeout: float = WAIT_S) -> Request:
        """Wait until a request is held here; the request."""
        if not self._reached.wait(timeout):
            msg = f"no request reached the pause within {timeout} s"
            raise TimeoutError(msg)
        assert self.request is not None
        return self.request

    def release(self, *, kill: bool = False) -> None:
        self._kill = kill
        self._go.set()

    def hold(self, request: Request) -> None:
        self.request = request
        self._reached.set()
        if not self._go.wait(WAIT_S * 10):
            msg = f"a pause at {request} was never released"
            raise TimeoutError(msg)
        if self._kill:
            raise Killed(request.path)


@dataclass
class LostAnswer:
    """The matching writes land, then their caller gets a network error.

    ``final``: the error says obstore's retries are spent (the store does not retry
    it either); otherwise it looks transient (the store may retry).
    """

    match: Callable[[Request], bool]
    times: int = 1
    final: bool = True
    hits: list[Request] = field(default_factory=list)

    def error(self, request: Request) -> GenericError:
        why = "after 10 retries, max_retries: 10" if self.final else "connection reset"
        return GenericError(
            f"injected: the answer to {request.op} {request.path} was lost ({why})"
        )


class World:
    """One bucket, its clock (unix seconds, moved by :meth:`advance`) and its hosts."""

    def __init__(self, *, start: float | None = None) -> None:
        self.bucket = MemoryStore()
        self.now = time.time() if start is None else start
        self.lock = threading.RLock()
        self.n_writes = 0  # writes that landed, all hosts
        self.created: dict[str, int] = {}  # path -> n_writes when it was created
        self.written: dict[str, float] = {}  # path -> world clock at its last write
        self.hosts: dict[str, Host] = {}

    def advance(self, seconds: float) -> None:
        """Time passes on every host (and for the bucket)."""
        with self.lock:
            self.now += seconds

    def host(self, name: str, *, offset: float = 0.0) -> Host:
        """A new host (a process) whose clock runs ``offset`` seconds ahead."""
        if name in self.hosts:
            msg = f"host {name!r} exists already"
            raise ValueError(msg)
        host = Host(self, name, offset)
        self.hosts[name] = host
        return host

    def listing(self, prefix: str | None) -> list[dict[str, Any]]:
        """Every object under ``prefix`` as the bucket lists it, times from our clock."""
        found = (m for batch in _REAL["list"](self.bucket, prefix) for m in batch)
        return sorted(map(self.stamped, found), key=lambda m: m["path"])

    def stamped(self, meta: Any) -> dict[str, Any]:
        """An object's metadata with its time from our clock (the bucket's)."""
        meta = dict(meta)
        stamp = self.written.get(meta["path"])
        if stamp is not None:
            meta["last_modified"] = dt.datetime.fromtimestamp(stamp, dt.UTC)
        return meta

    def objects(self) -> dict[str, bytes]:
        """Every object's bytes, by path (read straight from the bucket)."""
        return {
            m["path"]: bytes(_REAL["get"](self.bucket, m["path"]).bytes())
            for m in self.listing(None)
        }


class Host(MemoryStore):
    """One process's handle on a :class:`World`, with its clock offset and faults."""

    def __new__(cls, world: World, name: str, offset: float) -> Self:
        return super().__new__(cls)

    def __init__(self, world: World, name: str, offset: float) -> None:
        self.world = world
        self.name = name
        self.offset = offset
        self.requests: list[Request] = []
        self.dead = False
        self._lock = threading.Lock()
        self._pauses: list[Pause] = []
        self._lost: list[LostAnswer] = []
        self._kill_at: int | None = None
        self._n_writes = 0
        self._hide_newest = 0
        self._stale: tuple[int, list[dict[str, Any]]] | None = None

    def __repr__(self) -> str:
        return f"Host({self.name!r}, offset={self.offset:+g})"

    # --- what the store sees ---------------------------------------------------

    def clock(self) -> float:
        """This host's wall clock (unix seconds)."""
        return self.world.now + self.offset

    def policy(self, **kwargs: float) -> LeasePolicy:
        """A lease policy on this host's clock (the store's default lease and
        margin), renewed only where the store asks, not by its thread."""
        seconds = kwargs.pop("seconds", LeasePolicy().seconds)
        kwargs.setdefault("renew_seconds", QUIET_RENEW * seconds)
        return LeasePolicy(seconds=seconds, clock=self.clock, **kwargs)

    def open(self, **kwargs: Any) -> EmbeddingStore:
        """An EmbeddingStore of this host (its writer id is the host's name)."""
        kwargs.setdefault("writer_id", self.name)
        kwargs.setdefault("lease", self.policy())
        return EmbeddingStore(self, **kwargs)

    # --- faults ------------------------------------------------------------------

    def pause(self, match: Callable[[Request], bool], *, after: bool = False) -> Pause:
        """Hold the next matching request (see :class:`Pause`)."""
        pause = Pause(match, after=after)
        with self._lock:
            self._pauses.append(pause)
        return pause

    def pause_at_commit(self, *, after: bool = False) -> Pause:
        """Hold the host's first put-if-absent after it has written run data: the
        step that publishes its run (``after``: once that create landed)."""
        wrote_data = threading.Event()

        def match(r: Request) -> bool:
            if r.op == "put" and r.is_data():
                wrote_data.set()
            return r.op == "create" and wrote_data.is_set()

        return self.pause(match, after=after)

    def pause_at_write(self, n: int, *, after: bool = False) -> Pause:
        """Hold the host's ``n``-th write from now (1: the next)."""
        seen = [0]

        def match(r: Request) -> bool:
            if r.is_write:
                seen[0] += 1
            return seen[0] == n and r.is_write

        return self.pause(match, after=after)

    def kill_after(self, n_writes: int) -> None:
        """The host dies right after its ``n_writes``-th write from now landed."""
        with self._lock:
            self._kill_at = self._n_writes + n_writes

    def lose_answer(
        self, match: Callable[[Request], bool], *, times: int = 1, final: bool = True
    ) -> LostAnswer:
        lost = LostAnswer(match, times=times, final=final)
        with self._lock:
            self._lost.append(lost)
        return lost

    def lag_list(self, *, hide_newest: int) -> None:
        """LISTs hide the objects created by the bucket's last ``hide_newest`` writes."""
        self._hide_newest = hide_newest

    def stale_list(self, *, calls: int) -> None:
        """The next ``calls`` LISTs answer the listing as it is now."""
        self._stale = (calls, self.world.listing(None)) if calls else None

    def calm(self) -> None:
        """No more faults (pauses already holding a request still hold it)."""
        with self._lock:
            self._pauses.clear()
            self._lost.clear()
            self._kill_at = None
            self._hide_newest = 0
            self._stale = None

    def revive(self) -> None:
        """No faults, and requests pass again (at a test's end: a killed process's
        store may still delete its lease when it is garbage collected)."""
        self.calm()
        with self._lock:
            self.dead = False

    # --- the requests --------------------------------------------------------------

    def _enter(self, op: str, path: str) -> tuple[Request, Pause | None]:
        request = Request(op, path, threading.current_thread().name)
        with self._lock:
            if self.dead:
                raise Killed(path)
            self.requests.append(request)
            pause = next((p for p in self._pauses if p.match(request)), None)
            if pause is not None:
                self._pauses.remove(pause)
        if pause is not None and not pause.after:
            pause.hold(request)
            with self._lock:
                if self.dead:
                    raise Killed(path)
        return request, pause

    def _landed(self, request: Request, pause: Pause | None) -> None:
        """A write reached the bucket: count it, kill or lose the answer as set."""
        with self._lock:
            lost = next((lo for lo in self._lost if lo.match(request)), None)
            if lost is not None:
                lost.hits.append(request)
                lost.times -= 1
                if not lost.times:
                    self._lost.remove(lost)
            if request.is_write:
                self._n_writes += 1
                if self._kill_at is not None and self._n_writes >= self._kill_at:
                    self.dead = True
        if pause is not None and pause.after:
            pause.hold(request)
        if self.dead:
            raise Killed(request.path)
        if lost is not None:
            raise lost.error(request)

    def get(self, path: str, **kwargs: Any) -> Any:
        request, pause = self._enter("get", path)
        out = _REAL["get"](self.world.bucket, path, **kwargs)
        self._landed(request, pause)
        return out

    def head(self, path: str) -> Any:
        request, pause = self._enter("head", path)
        out = self.world.stamped(_REAL["head"](self.world.bucket, path))
        self._landed(request, pause)
        return out

    def put(self, path: str, data: Any, **kwargs: Any) -> Any:
        op = "create" if kwargs.get("mode") == "create" else "put"
        request, pause = self._enter(op, path)
        with self.world.lock:
            existed = self._exists(path)
            out = _REAL["put"](self.world.bucket, path, data, **kwargs)
            self.world.n_writes += 1
            if not existed:
                self.world.created[path] = self.world.n_writes
            self.world.written[path] = self.world.now
        self._landed(request, pause)
        return out

    def delete(self, paths: str | list[str]) -> None:
        names = [paths] if isinstance(paths, str) else list(paths)
        request, pause = self._enter("delete", names[0] if names else "")
        with self.world.lock:
            _REAL["delete"](self.world.bucket, paths)
            self.world.n_writes += 1
            for name in names:
                self.world.created.pop(name, None)
                self.world.written.pop(name, None)
        self._landed(request, pause)

    def _exists(self, path: str) -> bool:
        try:
            _REAL["head"](self.world.bucket, path)
        except FileNotFoundError:
            return False
        return True

    def list_all(self, prefix: str | None) -> list[dict[str, Any]]:
        """This host's LIST of ``prefix``: the bucket's, or a lagging one."""
        request, pause = self._enter("list", prefix or "")
        with self._lock:
            stale = self._stale
            if stale is not None:
                calls, snapshot = stale
                self._stale = (calls - 1, snapshot) if calls > 1 else None
        with self.world.lock:
            if stale is not None:
                found = [m for m in snapshot if _under(m["path"], prefix)]
            else:
                found = self.world.listing(prefix)
                if self._hide_newest:
                    newest = self.world.n_writes - self._hide_newest
                    found = [
                        m
                        for m in found
                        if self.world.created.get(m["path"], 0) <= newest
                    ]
        self._landed(request, pause)
        return found

    def list_with_delimiter(self, prefix: str | None) -> dict[str, Any]:
        base = f"{prefix.rstrip('/')}/" if prefix else ""
        dirs, objects = set(), []
        for meta in self.list_all(base or None):
            rest = meta["path"][len(base) :]
            if "/" in rest:
                dirs.add(base + rest.partition("/")[0])
            else:
                objects.append(meta)
        return {"common_prefixes": sorted(dirs), "objects": objects}


def _under(path: str, prefix: str | None) -> bool:
    """Whether a LIST of ``prefix`` holds ``path`` (prefixes are whole segments)."""
    base = (prefix or "").rstrip("/")
    return not base or path.startswith(f"{base}/")


# zarr's ObjectStore takes only obstore's own classes, by their module's name
Host.__module__ = f"obstore.{__name__}"


# --- routing obstore's functions ------------------------------------------------------

_REAL: dict[str, Any] = {
    name: getattr(obstore, name)
    for name in ("get", "head", "put", "delete", "list", "list_with_delimiter")
}
_installed = 0
_install_lock = threading.Lock()


def _get(store: Any, path: str, *args: Any, **kwargs: Any) -> Any:
    if isinstance(store, Host):
        return store.get(path, *args, **kwargs)
    return _REAL["get"](store, path, *args, **kwargs)


def _head(store: Any, path: str, *args: Any, **kwargs: Any) -> Any:
    if isinstance(store, Host):
        return store.head(path)
    return _REAL["head"](store, path, *args, **kwargs)


def _put(store: Any, path: str, data: Any, *args: Any, **kwargs: Any) -> Any:
    if isinstance(store, Host):
        return store.put(path, data, *args, **kwargs)
    return _REAL["put"](store, path, data, *args, **kwargs)


def _delete(store: Any, paths: Any, *args: Any, **kwargs: Any) -> Any:
    if isinstance(store, Host):
        return store.delete(paths)
    return _REAL["delete"](store, paths, *args, **kwargs)


def _list(store: Any, prefix: str | None = None, *args: Any, **kwargs: Any) -> Any:
    if isinstance(store, Host):
        return [store.list_all(prefix)]
    return _REAL["list"](store, prefix, *args, **kwargs)


def _list_with_delimiter(
    store: Any, prefix: str | None = None, *args: Any, **kwargs: Any
) -> Any:
    if isinstance(store, Host):
        return store.list_with_delimiter(prefix)
    return _REAL["list_with_delimiter"](store, prefix, *args, **kwargs)


_ROUTES = {
    "get": _get,
    "head": _head,
    "put": _put,
    "delete": _delete,
    "list": _list,
    "list_with_delimiter": _list_with_delimiter,
}


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """Route obstore's calls on :class:`Host` handles to their world (nestable)."""
    global _installed  # one patch of one module, counted
    with _install_lock:
        if not _installed:
            for name, route in _ROUTES.items():
                setattr(obstore, name, route)
        _installed += 1
    try:
        yield
    finally:
        with _install_lock:
            _installed -= 1
            if not _installed:
                for name, real in _REAL.items():
                    setattr(obstore, name, real)


class Outcome:
    """What a call run in a thread returned or raised."""

    def __init__(self, thread: threading.Thread) -> None:
        self.thread = thread
        self.value: Any = None
        self.error: BaseException | None = None

    def join(self, timeout: float = WAIT_S) -> Outcome:
        self.thread.join(timeout)
        if self.thread.is_alive():
            msg = f"{self.thread.name} did not finish within {timeout} s"
            raise TimeoutError(msg)
        return self

    @property
    def done(self) -> bool:
        return not self.thread.is_alive()


def in_thread(fn: Callable[[], Any], *, name: str) -> Outcome:
    """Run ``fn()`` in a thread of its own; its :class:`Outcome`."""
    outcome: Outcome

    def run() -> None:
        try:
            outcome.value = fn()
        except BaseException as err:  # noqa: BLE001 (Killed included: reported)
            outcome.error = err

    thread = threading.Thread(target=run, name=name, daemon=True)
    outcome = Outcome(thread)
    thread.start()
    return outcome


def wait_paused_or_done(
    pause: Pause, outcome: Outcome, timeout: float = WAIT_S
) -> bool:
    """Wait until ``outcome``'s thread holds at ``pause`` (True) or finished (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pause.reached:
            return True
        if outcome.done:
            return pause.reached
        time.sleep(0.001)
    msg = f"{outcome.thread.name} neither paused nor finished within {timeout} s"
    raise TimeoutError(msg)
