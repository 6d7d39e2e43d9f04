"""Writer leases: garbage collection keeps a leftover while its writer's lease is
fresh, whatever host and pid it names, and removes it once the lease expired by the
margin. Clocks are injected: no test waits minutes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

from embedcache.errors import StoreError
from embedcache.store import EmbeddingStore, LeasePolicy, commits, layout
from embedcache.store.backend import Backend
from embedcache.store.lease import Lease, lease_doc
from tests.store.worker import KEY, Clock, dataset

OTHER = "other~0123456789ab"  # a writer session in another container
RUN = f"{OTHER}~00000000cafe"


def backend_of(handle) -> Backend:
    return Backend(handle.raw)


def lease_paths(handle) -> list[str]:
    return handle.paths("leases/*/zarr.json")


def test_a_writers_lease_lives_while_it_writes_and_goes_when_it_closes(handle):
    hashes, vectors = dataset(20)
    store = handle.open(auto_merge=0)
    assert lease_paths(handle) == []  # opening writes nothing
    before = time.time()
    store.put(KEY, hashes[:10], vectors[:10])
    store.put(KEY, hashes[10:], vectors[10:])
    (path,) = lease_paths(handle)
    attrs = layout.group_attrs(handle.read(path), path, kind=layout.LEASE_KIND)
    assert attrs["writer"] == store.writer_id
    assert attrs["expires_ns"] / 1e9 >= before + layout.LEASE_S
    # every run of the session names the lease
    records = handle.paths("*/commits/*/zarr.json")
    runs = {p.split("/")[-2] for p in records if p.count("/") == 3}
    assert len(runs) == 2
    assert {layout.session_of(s) for s in runs} == {path.split("/")[1]}
    assert store.verify() == []  # a lease is not a fault
    store.close()
    assert lease_paths(handle) == []
    assert handle.paths("leases/zarr.json")  # the (empty) group stays
    got, found = handle.open().get(KEY, hashes)
    assert found.all()
    np.testing.assert_array_equal(got, vectors)


def test_a_zarr_client_sees_the_leases_as_a_group(tmp_path):
    import zarr

    root = tmp_path / "store"
    store = EmbeddingStore(root)
    hashes, vectors = dataset(5)
    store.put(KEY, hashes, vectors)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # zarr warns about what it cannot read
        group = zarr.open_group(root, mode="r")
        names = dict(group.members(max_depth=None))
    assert isinstance(names["leases"], zarr.Group)
    lease = [n for n in names if n.startswith("leases/")]
    assert len(lease) == 1
    assert isinstance(names[lease[0]], zarr.Group)
    store.close()


def put_leftover(
    handle, *, lease_renewed: float, host: str = layout.HOST, pid: int = 1
) -> str:
    """A half-written run of session OTHER, with its lease renewed at a time."""
    folder = f"{KEY.digest}/shards/{RUN}"
    handle.write(f"{folder}/zarr.json", b"{half written")
    doc = lease_doc(
        writer_id="other",
        session=OTHER,
        now=lease_renewed,
        seconds=layout.LEASE_S,
        host=host,
        pid=pid,
    )
    handle.write(layout.lease_path(OTHER), doc)
    return folder


def dead_pid() -> int:
    out = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout)


@pytest.mark.parametrize(
    "owner",
    [
        "our host, a pid dead here",  # host name + pid would call it dead
        "another host, our pid",  # two containers share a pid
    ],
)
def test_gc_keeps_a_leftover_while_its_lease_is_fresh_and_removes_it_after(
    handle, owner
):
    hashes, vectors = dataset(10)
    clock = Clock()
    store = handle.open(lease=LeasePolicy(clock=clock))
    store.put(KEY, hashes, vectors)
    if owner.startswith("our host"):
        host, pid = layout.HOST, dead_pid()
    else:
        host, pid = "otherhost", os.getpid()
    # the lease says it expired long ago by the writer's clock: never read
    folder = put_leftover(handle, lease_renewed=0.0, host=host, pid=pid)
    assert store.garbage() == [handle.location(folder)]  # first seen now
    first = clock.now
    for t in (1, layout.LEASE_S + 1, layout.LEASE_S + layout.LEASE_MARGIN_S - 1):
        clock.now = first + t
        store.compact()
        assert store.garbage() == [handle.location(folder)], t  # kept
    assert handle.paths(layout.lease_path(OTHER))  # a live lease is never removed
    clock.now = first + layout.LEASE_S + layout.LEASE_MARGIN_S + 1
    store.compact()
    assert store.garbage() == []
    assert not handle.paths(f"{folder}/*")
    # the run is claimed: a tombstone where its record would go
    tomb = handle.read(layout.record_path(KEY.digest, RUN))
    assert layout.is_tombstone(tomb)
    clock.now += 2  # the lease was first seen by the first compact(), 1 s later
    store.compact()
    assert not handle.paths(layout.lease_path(OTHER))  # the dead lease went too
    assert store.verify() == []
    np.testing.assert_array_equal(handle.open().get(KEY, hashes)[0], vectors)


def test_a_renewed_lease_keeps_its_leftover(handle):
    """A writer whose lease keeps changing keeps its run however old its objects,
    whatever times its lease names."""
    hashes, vectors = dataset(10)
    clock = Clock()
    store = handle.open(lease=LeasePolicy(clock=clock))
    store.put(KEY, hashes, vectors)
    folder = put_leftover(handle, lease_renewed=0.0)
    for renewal in range(1, 30):
        clock.now += layout.LEASE_RENEW_S
        put_leftover(handle, lease_renewed=renewal)  # a renewal: new bytes
        store.compact()
        assert store.garbage() == [handle.location(folder)]


def test_a_margin_is_configurable(handle):
    hashes, vectors = dataset(10)
    clock = Clock()
    store = handle.open(lease=LeasePolicy(margin_seconds=10, clock=clock))
    store.put(KEY, hashes, vectors)
    put_leftover(handle, lease_renewed=clock.now)
    assert len(store.garbage()) == 1
    clock.now += layout.LEASE_S + 11
    store.compact()
    assert store.garbage() == []


def test_a_fresh_collector_judges_nothing_dead(handle):
    """However old a leftover looks, a collector that has just started keeps it:
    it has not seen it sit still (no other clock is consulted)."""
    hashes, vectors = dataset(10)
    handle.open().put(KEY, hashes, vectors)
    folder = put_leftover(handle, lease_renewed=0.0)
    for _ in range(2):
        store = handle.open()
        store.compact()
        assert store.garbage() == [handle.location(folder)]


def test_the_lease_is_renewed_during_a_long_write_and_stops_when_idle(handle):
    policy = LeasePolicy(seconds=3.0, renew_seconds=0.1)
    lease = Lease(backend_of(handle), "w~000000000001", "w", policy)
    path = layout.lease_path(lease.name)

    def expires() -> int:
        return layout.group_attrs(handle.read(path), path, kind=layout.LEASE_KIND)[
            "expires_ns"
        ]

    lease.hold()  # a run is being written
    first = expires()
    deadline = time.monotonic() + 30
    while expires() == first:  # the renewer thread writes it again
        assert time.monotonic() < deadline, "the lease was never renewed"
        time.sleep(0.05)
    assert not lease.lapsed()
    lease.release()  # committed: nothing uncommitted is held any more
    while lease._thread is not None:
        assert time.monotonic() < deadline, "the renewer kept running while idle"
        time.sleep(0.05)
    idle = expires()
    time.sleep(0.3)
    assert expires() == idle
    lease.close()
    assert not handle.paths(path)


def test_a_commit_whose_lease_lapsed_is_refused(handle, monkeypatch):
    """A writer whose renewals failed for a whole lease may have lost its run to
    the collector: it must not publish it."""
    hashes, vectors = dataset(20)
    clock = Clock()
    store = handle.open(auto_merge=0, lease=LeasePolicy(clock=clock))
    store.put(KEY, hashes[:10], vectors[:10])
    write_run = commits.write_run

    def slow_write(*args, **kwargs):
        out = write_run(*args, **kwargs)
        clock.now += layout.LEASE_S + 1  # no renewal landed meanwhile
        return out

    monkeypatch.setattr(commits, "write_run", slow_write)
    monkeypatch.setattr(Lease, "renew", lambda self: None)  # the store is away
    with pytest.raises(StoreError, match="lease"):
        store.put(KEY, hashes[10:], vectors[10:])
    monkeypatch.undo()
    fresh = handle.open()
    assert fresh.get(KEY, hashes)[1].sum() == 10
    assert fresh.garbage() == []  # the unpublished run was dropped
    assert fresh.verify() == []
