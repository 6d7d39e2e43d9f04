"""The long-lived collector (`embedcache store collect --watch`): a one-shot
process judges nothing dead (its sightings start now); one that keeps collecting
removes an abandoned run once its lease lapsed as seen by the collector itself."""

from __future__ import annotations

from embedcache.cli import main
from embedcache.store import EmbeddingStore, LeasePolicy, layout
from embedcache.store.collection import watch
from embedcache.store.lease import lease_doc
from tests.store.worker import KEY, Clock, dataset

OTHER = "gone~0123456789ab"  # a writer session killed mid-run, on another host
RUN = f"{OTHER}~00000000dead"


def abandon_a_run(handle) -> str:
    """A half-written run of session OTHER, and its lease, never renewed again."""
    folder = f"{KEY.digest}/shards/{RUN}"
    handle.write(f"{folder}/vectors/zarr.json", b"{half written")
    doc = lease_doc(writer_id="gone", session=OTHER, now=0.0, seconds=layout.LEASE_S)
    handle.write(layout.lease_path(OTHER), doc)
    return folder


def test_a_watching_collector_removes_an_abandoned_run_after_its_lease_lapses(handle):
    hashes, vectors = dataset(10)
    handle.open().put(KEY, hashes, vectors)
    folder = abandon_a_run(handle)
    # one-shot collectors, one after another: each has seen the run only now
    for _ in range(3):
        assert handle.open().collect() == []
    assert handle.paths(f"{folder}/*")

    clock = Clock()
    collector = handle.open(lease=LeasePolicy(clock=clock))
    every = 60.0

    def wait(seconds: float) -> None:
        clock.now += seconds

    passes = list(watch(collector.collect, every=every, rounds=8, sleep=wait))
    lapsed = layout.LEASE_S + layout.LEASE_MARGIN_S  # 360 s on its own clock
    first = next(i for i, removed in enumerate(passes) if removed)
    assert first * every > lapsed  # not one pass before the lease lapsed
    assert (first - 1) * every <= lapsed
    assert passes[first] == [f"{RUN} of key {KEY.digest[:12]}"]
    assert not handle.paths(f"{folder}/*")
    tomb = handle.read(layout.record_path(KEY.digest, RUN))
    assert layout.is_tombstone(tomb)  # claimed first: a late commit fails
    assert not handle.paths(layout.lease_path(OTHER))  # its lease went too
    got, found = handle.open().get(KEY, hashes)
    assert found.all()
    assert (got == vectors).all()
    assert collector.verify() == []


def test_store_collect_runs_a_pass_or_keeps_watching(tmp_path, capsys):
    location = str(tmp_path / "store")
    hashes, vectors = dataset(10)
    EmbeddingStore(location).put(KEY, hashes, vectors)
    assert main(["store", "collect", "--store", location]) == 0
    out = capsys.readouterr().out
    assert out.count("pass ") == 1
    assert "pass 1: removed 0 run(s)" in out
    args = ["store", "collect", "--store", location, "--watch", "--every", "0"]
    assert main([*args, "--rounds", "3"]) == 0
    assert capsys.readouterr().out.count("pass ") == 3
