"""Writer leases: a live writer says so, and garbage collection believes only that.

A writer session (one :class:`~embedcache.store.commits.Writer`) names its shards
``<session>~<random>`` and keeps a lease object at ``leases/<session>/zarr.json``
(a Zarr group whose attrs say until when it lives). The lease is written before the
session's first shard object and renewed every :attr:`LeasePolicy.renew_seconds` by
a background thread for as long as the session holds an uncommitted shard; closing
the session deletes it. Garbage collection removes an uncommitted shard only once
its lease has expired by :attr:`LeasePolicy.margin_seconds` (a shard without a
lease, from an older writer, by the age of its newest object), never by host name
and pid, which two containers can share.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from embedcache.errors import CorruptStoreError
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
    parse_json,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from embedcache.store.backend import Backend

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LeasePolicy:
    """How long a lease lives, how often it is renewed, and the collector's margin.

    ``clock`` (unix seconds) is injectable so tests need not wait minutes. The
    margin covers clock skew between a writer and the collector and a renewal
    that is late (a busy machine, a retried request).
    """

    seconds: float = LEASE_S
    renew_seconds: float = LEASE_RENEW_S
    margin_seconds: float = LEASE_MARGIN_S
    clock: Callable[[], float] = field(default=time.time, compare=False)

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
) -> bytes:
    """A lease document: valid ``seconds`` from ``now`` (unix seconds)."""
    return group_doc(
        {
            "kind": LEASE_KIND,
            "schema_version": SCHEMA_VERSION,
            "writer": writer_id,
            "session": session,
            # host and pid are for people reading the store, never for decisions
            "host": host,
            "pid": os.getpid() if pid is None else pid,
            "renewed_ns": int(now * 1e9),
            "expires_ns": int((now + seconds) * 1e9),
        }
    )


def lease_expiry(data: bytes, where: str) -> float | None:
    """Until when (unix seconds) a lease document says its writer lives; None if
    the document is not a lease (it is then ignored, as a missing lease).

    The schema version is not checked: a lease only ever says "alive until".
    """
    try:
        attrs = parse_json(data, where)["attributes"]["embedcache"]
        if attrs["kind"] != LEASE_KIND:
            return None
        return int(attrs["expires_ns"]) / 1e9
    except (CorruptStoreError, KeyError, TypeError, ValueError):
        return None


class Lease:
    """The lease of one writer session (``name``): held while it writes shards.

    :meth:`hold` before writing a shard's first object (writes or renews the lease,
    and keeps a renewing thread running), :meth:`release` once the shard is
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
        self._written = False
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def hold(self) -> None:
        """A shard is about to be written: make sure the lease is fresh and kept so."""
        with self._lock:
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

    def release(self) -> None:
        with self._lock:
            self._holders -= 1

    def lapsed(self) -> bool:
        """Whether the lease may have expired (no renewal landed for a whole lease)."""
        renewed = self._renewed
        return renewed is None or self.policy.clock() > renewed + self.policy.seconds

    def renew(self) -> None:
        """Write the lease again, valid for :attr:`LeasePolicy.seconds` from now."""
        group = f"{LEASES}/{META}"
        if not self._written and not self._backend.exists(group):
            # the folder is a group, so a Zarr client sees a sound hierarchy
            attrs = {"kind": LEASES_KIND, "schema_version": SCHEMA_VERSION}
            self._backend.create(group, group_doc(attrs))
        now = self.policy.clock()
        doc = lease_doc(
            writer_id=self._writer_id,
            session=self.name,
            now=now,
            seconds=self.policy.seconds,
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
        self._stop = threading.Event()  # a later shard takes a new lease

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
