"""Writer leases: a live writer says so by changing its lease object.

A writer session (one :class:`~embedcache.store.commits.Writer`) names its runs
``<session>~<random>`` and keeps a lease object at ``leases/<session>/zarr.json``.
The lease is written before the session's first run object and rewritten every
:attr:`LeasePolicy.renew_seconds` by a background thread for as long as the session
holds an uncommitted run (each renewal writes new bytes: a counter); closing the
session deletes it.

No two hosts' clocks are ever compared. A collector calls a lease expired once the
lease object has stayed unchanged for ``seconds + margin_seconds`` on its *own*
monotonic clock since it first saw it that way (:class:`Sightings`). A writer calls
its own lease lost once no renewal landed for ``seconds`` on its own monotonic
clock; a lost lease stays lost (:attr:`Lease.lost`): its session never commits
again, the writer goes on under a new session. Safety does not rest on leases: a
collector claims a run with a tombstone before deleting it (``commits``), so a
writer the collector misjudged fails its commit cleanly. The lease only spares
live writers' work.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from embedcache.store.layout import (
    HOST,
    LEASE_KIND,
    LEASE_MARGIN_S,
    LEASE_RENEW_S,
    LEASE_S,
    LEASES,
    LEASES_KIND,
    META,
    SCHEMA_VERSION,
    group_doc,
    lease_path,
    new_session_name,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from embedcache.store.backend import Backend

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LeasePolicy:
    """How long a lease lives, how often it is renewed, and the collector's margin.

    ``clock`` is the observer's own monotonic clock (seconds), injectable so tests
    need not wait minutes; values from two processes are never compared. The
    margin covers a renewal that is late (a busy machine, a retried request).
    """

    seconds: float = LEASE_S
    renew_seconds: float = LEASE_RENEW_S
    margin_seconds: float = LEASE_MARGIN_S
    clock: Callable[[], float] = field(default=time.monotonic, compare=False)

    @property
    def dead_after(self) -> float:
        """How long a collector must see a lease (or a leaseless run) unchanged."""
        return self.seconds + self.margin_seconds

    def __post_init__(self) -> None:
        if not 0 < self.renew_seconds < self.seconds or self.margin_seconds < 0:
            msg = (
                f"lease policy {self.seconds}/{self.renew_seconds}/"
                f"{self.margin_seconds} s: renew_seconds must lie between 0 and "
                "seconds, and margin_seconds be >= 0"
            )
            raise ValueError(msg)


def lease_doc(
    *,
    writer_id: str,
    session: str,
    now: float,
    seconds: float,
    host: str = HOST,
    pid: int | None = None,
    renewals: int = 0,
) -> bytes:
    """A lease document: its ``renewals`` counter makes each renewal new bytes.

    ``now`` (unix seconds) and the expiry are for people reading the store; no
    decision reads them.
    """
    return group_doc(
        {
            "kind": LEASE_KIND,
            "schema_version": SCHEMA_VERSION,
            "writer": writer_id,
            "session": session,
            # host and pid are for people reading the store, never for decisions
            "host": host,
            "pid": os.getpid() if pid is None else pid,
            "renewals": renewals,
            "renewed_ns": int(now * 1e9),
            "expires_ns": int((now + seconds) * 1e9),
        }
    )


class Sightings:
    """What one collector saw of objects, and since when (its own monotonic clock).

    :meth:`unchanged_for` answers how long an object has shown the same
    ``fingerprint`` (its bytes, or a listing of a run's folder) to this observer.
    A first sighting is 0 s: a collector that has just started judges nothing dead.
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._seen: dict[str, tuple[object, float]] = {}
        self._lock = threading.Lock()

    def unchanged_for(self, name: str, fingerprint: object) -> float:
        now = self.clock()
        with self._lock:
            seen = self._seen.get(name)
            if seen is None or seen[0] != fingerprint:
                self._seen[name] = (fingerprint, now)
                return 0.0
            return now - seen[1]

    def forget(self, names: Iterable[str]) -> None:
        with self._lock:
            for name in names:
                self._seen.pop(name, None)


class Lease:
    """The lease of one writer session (``name``): held while it writes runs.

    :meth:`hold` before writing a run's first object (writes or renews the lease,
    and keeps a renewing thread running), :meth:`release` once the run is
    committed or dropped; :meth:`close` stops renewing and deletes the lease.
    """

    def __init__(
        self, backend: Backend, name: str, writer_id: str, policy: LeasePolicy
    ) -> None:
        self.name = name
        self.path = lease_path(name)
        self.policy = policy
        self._backend = backend
        self._writer_id = writer_id
        self._lock = threading.Lock()
        self._holders = 0
        self._renewed: float | None = None  # clock of the last renewal that landed
        self._renewals = 0
        self._written = False
        # sticky: once no renewal landed for a whole lease, a collector may have
        # claimed this session's runs; it never commits again
        self.lost = False
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def hold(self) -> None:
        """A run is about to be written: make sure the lease is fresh and kept so."""
        with self._lock:
            if not self._holders and not self.lost:
                # nothing was uncommitted since the last renewal: a lease that ran
                # out while idle guarded nothing, and is simply taken again
                stale = self._renewed is not None and (
                    self.policy.clock() - self._renewed >= self.policy.renew_seconds
                )
                if stale:
                    self._renewed = None
            self._holders += 1
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._renew_while_held,
                    name=f"lease {self.name}",
                    daemon=True,
                )
                self._thread.start()
            renewed = self._renewed
        now = self.policy.clock()
        if renewed is None or now - renewed >= self.policy.renew_seconds:
            try:
                self.renew()
            except BaseException:
                self.release()
                raise

    def successor(self) -> Lease:
        """A new session's lease for this writer (after this one was lost)."""
        return Lease(
            self._backend,
            new_session_name(self._writer_id),
            self._writer_id,
            self.policy,
        )

    def release(self) -> None:
        with self._lock:
            self._holders -= 1

    def lapsed(self) -> bool:
        """Whether the lease was ever lost: no renewal landed for a whole lease
        (on this process's monotonic clock: a pause counts)."""
        renewed = self._renewed
        if (
            self.lost
            or renewed is None
            or self.policy.clock() > renewed + self.policy.seconds
        ):
            self.lost = True
        return self.lost

    def renew(self) -> None:
        """Write the lease again, unless it was lost (then it stays lost)."""
        if self._renewed is not None and self.lapsed():
            return  # a renewal after a pause must not revive a claimed session
        group = f"{LEASES}/{META}"
        if not self._written and not self._backend.exists(group):
            # the folder is a group, so a Zarr client sees a sound hierarchy
            attrs = {"kind": LEASES_KIND, "schema_version": SCHEMA_VERSION}
            self._backend.create(group, group_doc(attrs))
        now = self.policy.clock()
        self._renewals += 1
        doc = lease_doc(
            writer_id=self._writer_id,
            session=self.name,
            now=time.time(),
            seconds=self.policy.seconds,
            renewals=self._renewals,
        )
        self._backend.write(self.path, doc)
        self._written = True
        self._renewed = now

    def close(self) -> None:
        """Stop renewing and delete the lease (it would expire by itself anyway)."""
        self._stop.set()
        thread = self._thread
        # the store's finaliser may run on any thread, the renewer's too
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        if self._written:
            # one plain delete, no thread pool: this may run at interpreter exit
            try:
                self._backend.delete(self.path)
                if self._backend.local is not None:  # gone if obstore cleaned up
                    with contextlib.suppress(FileNotFoundError):
                        (self._backend.local / self.path).parent.rmdir()
            except Exception as err:  # noqa: BLE001 (it expires by itself)
                logger.info("could not delete lease %s: %s", self.path, err)
            self._written = False
        self._renewed = None
        self._stop = threading.Event()  # a later run takes a new lease

    def _renew_while_held(self) -> None:
        while not self._stop.wait(self.policy.renew_seconds):
            with self._lock:
                if not self._holders:  # nothing uncommitted: let the lease run out
                    self._thread = None
                    return
            try:
                self.renew()
            except Exception as err:  # noqa: BLE001 (the commit checks lapsed())
                logger.warning("could not renew lease %s: %s", self.path, err)
        with self._lock:
            self._thread = None
