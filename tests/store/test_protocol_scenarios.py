"""The six findings of issue 41, each as the scenario a careful reviewer ran.

Every test drives several simulated hosts over one in-memory bucket
(``faulty_backend``): a writer paused at the step that publishes its run, a
collector whose clock runs ahead, many short-lived writers, a compaction by another
process between two steps of a put. Expectations are stated as what a reader gets
(a vector, a found mask, no error), not as the store's internal names.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from embedcache.errors import CorruptStoreError, StoreError
from embedcache.store import EmbeddingStore, LeasePolicy, migrate_store
from tests.store.conftest import WORKER
from tests.store.faulty_backend import (
    Killed,
    World,
    data_read,
    in_thread,
    wait_paused_or_done,
)
from tests.store.worker import DIM, KEY, dataset

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TEN_MINUTES = 600.0


def vectors_of(n: int, writer: int) -> np.ndarray:
    """Vectors of rows 0..n-1 as writer ``writer`` computed them: each writer's
    differ, so a reader can tell whose it was served."""
    return np.random.default_rng(writer).standard_normal((n, DIM)).astype(np.float32)


def fresh_reader(world) -> EmbeddingStore:
    """A new process on a new host with a sound clock, seeing every commit."""
    return world.host(f"reader-{len(world.hosts)}").open(refresh_seconds=0)


def n_runs(store: EmbeddingStore) -> int:
    """The key's visible runs, as ``keys()`` reports them."""
    (info,) = store.keys()
    count = getattr(info, "n_runs", None)
    return info.n_runs if count is None else count


def assert_serves(store: EmbeddingStore, hashes, vectors) -> None:
    got, found = store.get(KEY, hashes)
    assert found.all(), f"{(~found).sum()} of {len(hashes)} rows not found"
    np.testing.assert_array_equal(got, vectors)


# --- 1: a paused writer and a collector ------------------------------------------------


def test_a_paused_writers_late_commit_never_makes_the_key_unreadable(world):
    """Finding 1. A writer stops for ten minutes just before publishing its run;
    another process collects garbage meanwhile. The late commit either fails
    cleanly or its rows are all there; every healthy row still reads."""
    hashes, _ = dataset(40)
    healthy_vectors, slow_vectors = vectors_of(40, 1), vectors_of(40, 2)
    world.host("healthy").open(auto_merge=0).put(KEY, hashes[:20], healthy_vectors[:20])
    slow_host = world.host("slow")
    slow = slow_host.open(auto_merge=0)
    pause = slow_host.pause_at_commit()
    late = in_thread(
        lambda: slow.put(KEY, hashes[20:], slow_vectors[20:]), name="slow put"
    )
    assert wait_paused_or_done(pause, late), "the slow writer never reached its commit"
    collector = world.host("collector").open(auto_merge=0)
    collector.compact()  # sees the slow writer's lease
    world.advance(TEN_MINUTES)  # nobody renews it
    collector.compact()
    pause.release()
    late.join()

    reader = fresh_reader(world)
    assert_serves(reader, hashes[:20], healthy_vectors[:20])
    got, found = reader.get(KEY, hashes[20:])
    if late.error is None:
        assert late.value == 20
        assert found.all()
        np.testing.assert_array_equal(got, slow_vectors[20:])
    else:
        assert isinstance(late.error, StoreError), repr(late.error)
        assert not isinstance(late.error, CorruptStoreError), repr(late.error)
    assert reader.verify() == []


def is_commit_record(data: bytes) -> bool:
    try:
        attrs = json.loads(data)["attributes"]["embedcache"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(attrs, dict) and attrs.get("kind") == "embedcache-commit"


def damage(world, paths: list[str], how: str) -> None:
    """Damage one run, given every object it added: its fences go, a vector chunk
    loses a bit, or its commit records become unparsable."""
    objects = world.objects()
    host = world.host("vandal")
    if how == "fences":
        (target,) = (p for p in paths if "/fences/c/" in p)
        host.delete(target)
    elif how == "vectors":
        target = min(p for p in paths if "/vectors/c/" in p)
        data = bytearray(objects[target])
        data[0] ^= 0x01
        host.put(target, bytes(data))
    else:  # every record of it (a claim and a log entry, say)
        records = [p for p in paths if is_commit_record(objects[p])]
        assert records
        for target in records:
            host.put(target, b"{not json")


@pytest.mark.parametrize("how", ["fences", "vectors", "record"])
def test_one_bad_run_is_skipped_not_fatal(world, how):
    """Finding 1 (one broken record made the key unreadable). A run whose object is
    missing, fails its checksum, or whose record is unparsable is skipped: its rows
    read as absent, every other row reads, a put stores them again, and verify
    names the fault."""
    hashes, vectors = dataset(30)
    writer = world.host("writer").open(auto_merge=0)
    writer.put(KEY, hashes[:10], vectors[:10])
    before = set(world.objects())
    writer.put(KEY, hashes[10:20], vectors[10:20])
    damage(world, sorted(set(world.objects()) - before), how)
    writer.put(KEY, hashes[20:], vectors[20:])

    reader = fresh_reader(world)
    got, found = reader.get(KEY, hashes)
    assert found[:10].all()
    assert found[20:].all()
    assert not found[10:20].any()
    np.testing.assert_array_equal(got[found], vectors[found])
    assert reader.verify() != []
    # as an embed run does: look up, compute what is missing, put it
    again = fresh_reader(world)
    assert not again.get(KEY, hashes[10:20])[1].any()
    assert again.put(KEY, hashes[10:20], vectors[10:20]) == 10
    assert_serves(fresh_reader(world), hashes, vectors)


# --- 2: first served, forever served -----------------------------------------------------


def test_a_vector_once_served_is_served_forever(world):
    """Finding 2. Writer A starts first but its create is slow; writer B commits
    the same hashes; a reader is served B's vectors. A's create then lands, and a
    compaction merges everything: the reader, and a fresh one, still get B's."""
    hashes, _ = dataset(12)
    a_vectors, b_vectors = vectors_of(12, 10), vectors_of(12, 11)
    a_host = world.host("writer-a")
    a = a_host.open(auto_merge=0)
    pause = a_host.pause_at_commit()
    slow = in_thread(lambda: a.put(KEY, hashes, a_vectors), name="writer a")
    assert wait_paused_or_done(pause, slow), "writer A never reached its commit"
    assert world.host("writer-b").open(auto_merge=0).put(KEY, hashes, b_vectors) == 12
    reader = fresh_reader(world)
    assert_serves(reader, hashes, b_vectors)

    pause.release()
    slow.join()
    assert slow.error is None or isinstance(slow.error, StoreError), repr(slow.error)
    assert_serves(reader, hashes, b_vectors)
    assert_serves(fresh_reader(world), hashes, b_vectors)
    world.host("compactor").open(auto_merge=0).compact()
    assert_serves(reader, hashes, b_vectors)
    assert_serves(fresh_reader(world), hashes, b_vectors)


# --- 3: many short writers -----------------------------------------------------------------


def test_many_short_lived_writers_leave_a_logarithmic_number_of_runs(world):
    """Finding 3. 40 writers, one after another, each putting 15 rows one at a
    time and closing, leave a number of runs logarithmic in the 600 rows (merge
    fan-in 16: at most 15 runs of each of three levels), and every row reads."""
    n_writers, n_puts = 40, 15
    hashes, vectors = dataset(n_writers * n_puts)
    for w in range(n_writers):
        with world.host(f"short-{w}").open() as store:
            for i in range(w * n_puts, (w + 1) * n_puts):
                assert store.put(KEY, hashes[i : i + 1], vectors[i : i + 1]) == 1
    reader = fresh_reader(world)
    assert_serves(reader, hashes, vectors)
    fan_in = 16
    bound = (fan_in - 1) * math.ceil(math.log(len(hashes), fan_in))
    assert n_runs(reader) <= bound


def test_120_short_runs_of_100_rows_leave_at_most_16_runs(world):
    """Issue 41, done when: 120 separate processes each add 100 new rows to one
    store (one put each, with the store's default merge policy) and leave at most
    16 runs; every row reads."""
    n_processes, per = 120, 100
    hashes, vectors = dataset(n_processes * per)
    for p in range(n_processes):
        rows = slice(p * per, (p + 1) * per)
        with world.host(f"embed-{p}").open() as store:
            assert store.put(KEY, hashes[rows], vectors[rows]) == per
    reader = fresh_reader(world)
    assert n_runs(reader) <= 16
    assert_serves(reader, hashes, vectors)


@pytest.mark.slow
def test_120_writer_processes_on_a_folder_leave_at_most_16_runs(tmp_path):
    """The same with 120 real processes (``worker.py``) on a local folder, one
    after another, each with the store's default merge policy (minutes)."""
    root = tmp_path / "store"
    n_processes, per = 120, 100
    for p in range(n_processes):
        subprocess.run(
            [
                sys.executable,
                str(WORKER),
                str(root),
                *("--start", str(p * per), "--stop", str((p + 1) * per)),
                *("--batch", str(per), "--auto-merge", "16"),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
    hashes, vectors = dataset(n_processes * per)
    reader = EmbeddingStore(root, refresh_seconds=0)
    assert n_runs(reader) <= 16
    assert_serves(reader, hashes, vectors)


# --- 4: migrate refusing a key ------------------------------------------------------------


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_migrate_leaves_a_key_it_refuses_byte_for_byte_unchanged(tmp_path):
    """Finding 4. A schema-3 key with a damaged vector chunk is refused by
    ``migrate``; every object of that key is as it was (the old version still
    reads it), and the store stays schema 3."""
    root = tmp_path / "old"
    shutil.copytree(FIXTURES / "store-schema3", root)
    sys.path.insert(0, str(FIXTURES))
    try:
        from make_store_schema3 import KEY_A
    finally:
        sys.path.remove(str(FIXTURES))
    damaged = min(root.glob(f"{KEY_A.digest}/shards/*/vectors/c/0/0"))
    data = bytearray(damaged.read_bytes())
    data[0] ^= 0xFF
    damaged.write_bytes(bytes(data))
    key_folder = root / KEY_A.digest
    before = tree_bytes(key_folder)
    root_doc = (root / "zarr.json").read_bytes()

    with pytest.raises(CorruptStoreError):
        migrate_store(root)
    assert tree_bytes(key_folder) == before
    assert (root / "zarr.json").read_bytes() == root_doc
    with pytest.raises(StoreError, match="schema_version 3"):
        EmbeddingStore(root, create=False)


def test_migrate_refuses_while_an_old_schema_writer_holds_a_lease(tmp_path):
    """Finding 4. A schema-3 writer is at work (its lease was written just now):
    ``migrate`` refuses, naming the lease, and changes nothing."""
    root = tmp_path / "old"
    shutil.copytree(FIXTURES / "store-schema3", root)
    now_ns = time.time_ns()
    lease = {
        "zarr_format": 3,
        "node_type": "group",
        "attributes": {
            "embedcache": {
                "kind": "embedcache-lease",
                "schema_version": 3,
                "writer": "old-writer",
                "session": "old-writer~0123456789ab",
                "host": "elsewhere",
                "pid": 1,
                "renewed_ns": now_ns,
                "expires_ns": now_ns + 60 * 10**9,
            }
        },
    }
    folder = root / "leases" / "old-writer~0123456789ab"
    folder.mkdir()
    (folder / "zarr.json").write_text(json.dumps(lease))
    before = tree_bytes(root)

    with pytest.raises(StoreError, match="lease") as err:
        migrate_store(root)
    assert not isinstance(err.value, CorruptStoreError)
    assert tree_bytes(root) == before


# --- 5: a put whose runs another process compacted ------------------------------------------


def test_a_put_does_not_raise_after_its_commit_landed(world):
    """Finding 5. A writer's put commits its run; before its own merge starts,
    another process compacts the runs that merge would take. The put returns its
    count, and every row reads."""
    hashes, vectors = dataset(30)
    writer_host = world.host("writer")
    writer = writer_host.open(auto_merge=2)
    assert writer.put(KEY, hashes[:10], vectors[:10]) == 10
    watcher = world.host("watcher").open(refresh_seconds=0)
    # the writer's first request once its rows read (its run is published)
    pause = writer_host.pause(lambda _: watcher.contains(KEY, hashes[10:20]).all())
    put = in_thread(lambda: writer.put(KEY, hashes[10:20], vectors[10:20]), name="put")
    # (a put that makes no request after its commit has nothing to trip on)
    wait_paused_or_done(pause, put)
    world.host("compactor").open(auto_merge=0).compact()
    pause.release()
    put.join()
    assert put.error is None, repr(put.error)
    assert put.value == 10
    assert writer.put(KEY, hashes[20:], vectors[20:]) == 10
    assert_serves(fresh_reader(world), hashes, vectors)


def test_hashes_survives_a_compaction_under_it(world):
    """Finding 5. A long whole-key read (``hashes()``) in one process while another
    compacts the runs it is reading: it returns every hash, no error."""
    hashes, vectors = dataset(40)
    writer = world.host("writer").open(auto_merge=0)
    for i in range(0, 40, 10):
        writer.put(KEY, hashes[i : i + 10], vectors[i : i + 10])
    reader_host = world.host("reader")
    reader = reader_host.open(refresh_seconds=0)
    assert_serves(reader, hashes, vectors)  # the reader knows the four runs
    pause = reader_host.pause(data_read)
    listing = in_thread(lambda: reader.hashes(KEY), name="hashes")
    assert wait_paused_or_done(pause, listing), "hashes() read no run data"
    world.host("compactor").open(auto_merge=0).compact()
    pause.release()
    listing.join()
    assert listing.error is None, repr(listing.error)
    assert listing.value == sorted(hashes)


# --- 6: clocks ---------------------------------------------------------------------------------


def test_a_collector_an_hour_ahead_keeps_a_live_writers_run(world):
    """Finding 6. The collector's clock runs an hour ahead of the writer's. It looks
    twice, 30 s apart, while the writer (alive, its lease fresh) is about to
    publish: the run is kept, the commit lands and every row reads."""
    hashes, vectors = dataset(20)
    writer_host = world.host("writer")
    writer = writer_host.open(auto_merge=0)
    assert writer.put(KEY, hashes[:10], vectors[:10]) == 10
    pause = writer_host.pause_at_commit()
    put = in_thread(lambda: writer.put(KEY, hashes[10:], vectors[10:]), name="put")
    assert wait_paused_or_done(pause, put), "the put never reached its commit"
    collector = world.host("collector", offset=3600.0).open(auto_merge=0)
    collector.compact()
    world.advance(30.0)
    collector.compact()
    pause.release()
    put.join()
    assert put.error is None, repr(put.error)
    assert put.value == 10
    assert_serves(fresh_reader(world), hashes, vectors)


@pytest.mark.parametrize("lag", ["hide-newest", "stale"])
def test_a_lagging_list_never_gets_a_committed_run_deleted(world, lag):
    """A collector's LIST lags (an eventually consistent bucket): it misses the
    newest run's record, or answers an old listing. Time passes, it compacts and
    collects twice (or gives up cleanly): no committed row is lost."""
    hashes, vectors = dataset(30)
    collector_host = world.host("collector")
    collector = collector_host.open(auto_merge=0)
    with world.host("writer").open(auto_merge=0) as writer:
        for i in range(0, 30, 10):
            writer.put(KEY, hashes[i : i + 10], vectors[i : i + 10])
            if i == 10 and lag == "stale":
                collector_host.stale_list(calls=20)
    if lag == "hide-newest":
        collector_host.lag_list(hide_newest=3)  # the last record, and the lease gone
    for _ in range(2):
        try:
            collector.compact()
        except StoreError as err:  # it may give up, cleanly, while its view lags
            assert not isinstance(err, CorruptStoreError), err  # noqa: PT017
        world.advance(4000.0)
    collector_host.calm()
    assert_serves(fresh_reader(world), hashes, vectors)


def test_a_folder_of_staging_files_without_a_lease_is_collected(tmp_path):
    """Finding 6. A writer killed in its first write leaves a run folder holding
    only the local store's staging file, and its lease is gone. A collector that
    sees it, then sees it again past the lease and its margin, removes it."""
    root = tmp_path / "store"
    now = [1_000_000.0]
    policy = LeasePolicy(clock=lambda: now[0])
    hashes, vectors = dataset(10)
    EmbeddingStore(root, lease=policy).put(KEY, hashes, vectors)
    (runs_folder,) = (p for p in root.glob("*/shards") if p.is_dir())
    orphan = runs_folder / "gone~0123456789ab~00000000cafe"
    orphan.mkdir()
    (orphan / "zarr.json#1").write_bytes(b"half a group document")  # obstore's staging
    collector = EmbeddingStore(root, lease=policy)
    collector.compact()
    now[0] += 2 * (policy.seconds + policy.margin_seconds)
    collector.compact()
    assert not orphan.exists()
    assert collector.garbage() == []
    assert_serves(EmbeddingStore(root, refresh_seconds=0), hashes, vectors)


# --- kills between any two object writes --------------------------------------------------


def put_in_two(world, hashes, vectors, *, kill_at: int | None) -> EmbeddingStore:
    """One writer puts the first half and closes; a second puts the other half,
    killed after its ``kill_at``-th object write; the second (keep it until the
    end: a killed process's lease stays, and its store would delete it when
    garbage collected)."""
    with world.host("first").open(auto_merge=0) as first:
        first.put(KEY, hashes[:10], vectors[:10])
    victim_host = world.host("victim")
    victim = victim_host.open(auto_merge=0)
    if kill_at is not None:
        victim_host.kill_after(kill_at)
    with contextlib.suppress(Killed):
        victim.put(KEY, hashes[10:], vectors[10:])
    return victim


def collect_twice(world) -> EmbeddingStore:
    """A collector that looks, waits past every lease and margin, and looks again."""
    collector = world.host(f"collector-{len(world.hosts)}").open(auto_merge=0)
    collector.compact()
    world.advance(4000.0)
    collector.compact()
    return collector


def n_writes_of(scenario) -> int:
    """How many object writes the victim host makes in an unkilled run."""
    world = World()
    with scenario(world, kill_at=None):
        return sum(r.is_write for r in world.hosts["victim"].requests)


def test_a_put_killed_after_any_write_leaves_a_sound_store(world):
    """A writer killed after each of its object writes in turn: its rows are all
    there or none, every other row reads, collection leaves no garbage, and the
    put run again stores what is missing."""
    hashes, vectors = dataset(20)
    n = n_writes_of(lambda w, kill_at: put_in_two(w, hashes, vectors, kill_at=kill_at))
    assert n > 5
    for k in range(1, n + 1):
        world = World()
        victim = put_in_two(world, hashes, vectors, kill_at=k)
        got, found = fresh_reader(world).get(KEY, hashes)
        assert found[:10].all(), k
        assert found[10:].all() or not found[10:].any(), k
        np.testing.assert_array_equal(got[found], vectors[found])
        collector = collect_twice(world)
        assert collector.garbage() == [], k
        world.host(f"again-{k}").open(auto_merge=0).put(KEY, hashes, vectors)
        assert_serves(fresh_reader(world), hashes, vectors)
        world.hosts["victim"].revive()
        del victim


def compact_killed(world, hashes, vectors, *, kill_at: int | None) -> EmbeddingStore:
    """A writer puts three runs and closes; another process compacts, killed after
    its ``kill_at``-th object write; that process's store (as ``put_in_two``)."""
    with world.host("writer").open(auto_merge=0) as writer:
        for i in range(0, 30, 10):
            writer.put(KEY, hashes[i : i + 10], vectors[i : i + 10])
    victim_host = world.host("victim")
    victim = victim_host.open(auto_merge=0)
    if kill_at is not None:
        victim_host.kill_after(kill_at)
    with contextlib.suppress(Killed):
        victim.compact()
    return victim


def test_a_compaction_killed_after_any_write_leaves_a_sound_store(world):
    """A compaction killed after each of its object writes in turn: every row
    reads throughout, and a later collection leaves one run and no garbage."""
    hashes, vectors = dataset(30)
    n = n_writes_of(
        lambda w, kill_at: compact_killed(w, hashes, vectors, kill_at=kill_at)
    )
    assert n > 5
    for k in range(1, n + 1):
        world = World()
        victim = compact_killed(world, hashes, vectors, kill_at=k)
        assert_serves(fresh_reader(world), hashes, vectors)
        collector = collect_twice(world)
        assert collector.garbage() == [], k
        reader = fresh_reader(world)
        assert_serves(reader, hashes, vectors)
        assert n_runs(reader) == 1, k
        world.hosts["victim"].revive()
        del victim
