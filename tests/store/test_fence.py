"""Collection is fenced: a collector claims an uncommitted run with a tombstone where
its commit record would go before deleting any of it, so a late commit fails
cleanly and its writer writes the run again under a new name; a writer whose lease
was ever lost does not commit; a commit that landed is never undone."""

from __future__ import annotations

import numpy as np
import pytest

from embedcache.errors import StoreError
from embedcache.store import LeasePolicy, commits, layout
from embedcache.store.backend import Backend
from embedcache.store.lease import Lease
from tests.store.worker import KEY, Clock, dataset


def runs_of(handle) -> list[str]:
    """Names of the runs with a commit record (tombstones left out)."""
    out = []
    for path in handle.paths(f"{KEY.digest}/commits/*/zarr.json"):
        if path.count("/") == 3 and not layout.is_tombstone(handle.read(path)):
            out.append(path.split("/")[2])
    return out


def tombstones(handle) -> list[str]:
    paths = handle.paths(f"{KEY.digest}/commits/*/zarr.json")
    return [p.split("/")[2] for p in paths if layout.is_tombstone(handle.read(p))]


def test_a_run_claimed_before_its_commit_is_written_again_under_a_new_name(
    handle, monkeypatch
):
    """Finding 1: a paused writer's run is collected; its commit must not land."""
    hashes, vectors = dataset(20)
    store = handle.open(auto_merge=0)
    store.put(KEY, hashes[:10], vectors[:10])
    write_run = commits.write_run
    claimed = []

    def collected_meanwhile(backend, prefix, **kwargs):
        out = write_run(backend, prefix, **kwargs)
        if not claimed:  # the first attempt: a collector takes it while we sleep
            run = prefix.rpartition("/")[2]
            assert commits.claim(backend, KEY.digest, run, "collector")
            backend.delete_prefix(prefix)
            claimed.append(run)
        return out

    monkeypatch.setattr(commits, "write_run", collected_meanwhile)
    assert store.put(KEY, hashes[10:], vectors[10:]) == 10
    monkeypatch.undo()
    assert tombstones(handle) == claimed  # the claim stays: a late create fails
    assert claimed[0] not in runs_of(handle)
    assert len(runs_of(handle)) == 2  # the first put's and the rewritten one
    fresh = handle.open()
    got, found = fresh.get(KEY, hashes)
    assert found.all()
    np.testing.assert_array_equal(got, vectors)
    assert fresh.verify() == []
    assert fresh.garbage() == []


def test_a_claim_loses_to_a_commit_that_landed_first(handle):
    hashes, vectors = dataset(10)
    store = handle.open()
    store.put(KEY, hashes, vectors)
    (run,) = runs_of(handle)
    backend = Backend(handle.raw)
    assert not commits.claim(backend, KEY.digest, run, "collector")
    assert tombstones(handle) == []
    np.testing.assert_array_equal(handle.open().get(KEY, hashes)[0], vectors)


def test_a_writer_whose_lease_was_lost_never_commits_that_session(handle, monkeypatch):
    """A pause longer than the lease: the renewer wakes first and writes the lease
    again, but the session stays lost; the run goes under a new session."""
    hashes, vectors = dataset(20)
    clock = Clock()
    store = handle.open(auto_merge=0, lease=LeasePolicy(clock=clock))
    store.put(KEY, hashes[:10], vectors[:10])
    first_session = store._writer.lease.name
    write_run = commits.write_run
    paused = []

    def paused_while_writing(backend, prefix, **kwargs):
        out = write_run(backend, prefix, **kwargs)
        if not paused:
            paused.append(prefix.rpartition("/")[2])
            clock.now += layout.LEASE_S + 1  # SIGSTOP, a VM migration, a GC pause
            store._writer.lease.renew()  # the renewer thread wakes first
        return out

    monkeypatch.setattr(commits, "write_run", paused_while_writing)
    assert store.put(KEY, hashes[10:], vectors[10:]) == 10
    monkeypatch.undo()
    assert layout.session_of(paused[0]) == first_session
    assert paused[0] in tombstones(handle)  # its own run, claimed before deleting
    sessions = {layout.session_of(r) for r in runs_of(handle)}
    assert first_session in sessions  # the first put, before the pause
    (later,) = sessions - {first_session}
    assert later != first_session
    assert store._writer.lease.name == later
    assert not handle.paths(f"{KEY.digest}/shards/{paused[0]}/*")
    got, found = handle.open().get(KEY, hashes)
    assert found.all()
    np.testing.assert_array_equal(got, vectors)


def test_a_lost_lease_is_not_revived_by_a_renewal(handle):
    clock = Clock()
    policy = LeasePolicy(clock=clock)
    lease = Lease(Backend(handle.raw), "w~000000000001", "w", policy)
    lease.hold()
    clock.now += layout.LEASE_S - 1
    assert not lease.lapsed()
    lease.renew()
    clock.now += layout.LEASE_S + 1
    lease.renew()  # a late renewal lands, but too late
    assert lease.lapsed()
    clock.now += 1
    lease.renew()
    assert lease.lapsed()
    assert lease.lost
    lease.release()
    lease.close()


def test_an_idle_lease_that_ran_out_is_simply_taken_again(handle):
    """Nothing uncommitted while it ran out: nothing could have been claimed."""
    hashes, vectors = dataset(20)
    clock = Clock()
    store = handle.open(auto_merge=0, lease=LeasePolicy(clock=clock))
    store.put(KEY, hashes[:10], vectors[:10])
    session = store._writer.lease.name
    clock.now += 10 * layout.LEASE_S
    store.put(KEY, hashes[10:], vectors[10:])
    assert store._writer.lease.name == session
    assert tombstones(handle) == []


def test_a_put_whose_record_landed_but_whose_answer_was_lost_succeeds(
    handle, monkeypatch
):
    """Finding 5's promise: a put never raises after its commit landed."""
    hashes, vectors = dataset(10)
    store = handle.open(auto_merge=0)
    create = Backend.create
    lost = []

    def landed_then_lost(self, path, data):
        made = create(self, path, data)
        if path.count("/") == 3 and "/commits/" in path and not lost:
            lost.append(path)
            msg = "connection reset after the write landed"
            raise StoreError(msg)
        return made

    monkeypatch.setattr(Backend, "create", landed_then_lost)
    assert store.put(KEY, hashes, vectors) == 10
    monkeypatch.undo()
    assert lost
    assert tombstones(handle) == []
    got, found = handle.open().get(KEY, hashes)
    assert found.all()
    np.testing.assert_array_equal(got, vectors)


def test_a_failed_commit_that_never_landed_is_claimed_and_removed(handle, monkeypatch):
    hashes, vectors = dataset(10)
    store = handle.open(auto_merge=0)
    create = Backend.create

    def refused(self, path, data):
        if (
            path.count("/") == 3
            and "/commits/" in path
            and not layout.is_tombstone(data)
        ):
            msg = "the store is away"
            raise StoreError(msg)
        return create(self, path, data)

    monkeypatch.setattr(Backend, "create", refused)
    with pytest.raises(StoreError, match="away"):
        store.put(KEY, hashes, vectors)
    monkeypatch.undo()
    assert runs_of(handle) == []
    assert len(tombstones(handle)) == 1  # claimed: a create still in flight fails
    assert handle.paths(f"{KEY.digest}/shards/*/*/*") == []
    assert handle.open().verify() == []
