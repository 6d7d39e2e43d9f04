"""The fault injection of ``faulty_backend`` does what the protocol tests rely on."""

from __future__ import annotations

import numpy as np
import obstore
import pytest
from obstore.exceptions import GenericError
from obstore.store import MemoryStore

from tests.store.faulty_backend import Killed, in_thread, op_is, wait_paused_or_done
from tests.store.worker import KEY, dataset


def test_hosts_share_one_bucket_and_other_stores_pass_straight_through(world):
    a, b = world.host("a"), world.host("b")
    obstore.put(a, "x/1", b"one")
    assert bytes(obstore.get(b, "x/1").bytes()) == b"one"
    plain = MemoryStore()
    obstore.put(plain, "y", b"two")
    assert list(world.objects()) == ["x/1"]
    assert bytes(obstore.get(plain, "y").bytes()) == b"two"


def test_a_store_on_a_host_round_trips(world):
    hashes, vectors = dataset(8)
    world.host("writer").open().put(KEY, hashes, vectors)
    got, found = world.host("reader").open().get(KEY, hashes)
    assert found.all()
    np.testing.assert_array_equal(got, vectors)


def test_a_kill_lands_exactly_k_writes_then_stops_the_host(world):
    host = world.host("a")
    host.kill_after(2)
    obstore.put(host, "k/1", b"1")
    with pytest.raises(Killed):
        obstore.put(host, "k/2", b"2")
    with pytest.raises(Killed):
        obstore.get(host, "k/1")
    assert sorted(world.objects()) == ["k/1", "k/2"]


def test_a_lost_answer_lands_the_write_and_raises(world):
    host = world.host("a")
    lost = host.lose_answer(op_is("create"))
    obstore.put(host, "p", b"plain")
    with pytest.raises(GenericError, match="was lost"):
        obstore.put(host, "c", b"made", mode="create")
    assert world.objects() == {"p": b"plain", "c": b"made"}
    assert [r.path for r in lost.hits] == ["c"]
    obstore.put(host, "d", b"next", mode="create")  # once only


def test_a_lagging_list_hides_the_newest_objects_and_a_stale_one_the_later(world):
    host, other = world.host("a"), world.host("b")
    for name in ("r/1", "r/2", "r/3"):
        obstore.put(other, name, b"x")
    host.lag_list(hide_newest=1)
    assert [m["path"] for b in obstore.list(host, "r") for m in b] == ["r/1", "r/2"]
    host.calm()
    host.stale_list(calls=1)
    obstore.delete(other, "r/1")
    obstore.put(other, "r/4", b"x")
    listed = obstore.list_with_delimiter(host, None)
    assert listed["common_prefixes"] == ["r"]
    stale = [m["path"] for b in obstore.list(host, "r") for m in b]
    assert stale == ["r/2", "r/3", "r/4"]  # one stale call only


def test_a_pause_holds_a_request_until_released_or_killed(world):
    host = world.host("a")
    pause = host.pause(op_is("put", pattern="slow/*"), after=True)
    outcome = in_thread(lambda: obstore.put(host, "slow/1", b"x"), name="put")
    assert wait_paused_or_done(pause, outcome)
    assert "slow/1" in world.objects()  # held after it landed
    pause.release()
    assert outcome.join().error is None

    before = host.pause(op_is("put"))
    outcome = in_thread(lambda: obstore.put(host, "slow/2", b"x"), name="put")
    assert wait_paused_or_done(before, outcome)
    before.release(kill=True)
    assert isinstance(outcome.join().error, Killed)
    assert "slow/2" not in world.objects()


def test_object_times_follow_the_worlds_clock_and_host_clocks_their_offset(world):
    host = world.host("ahead", offset=3600.0)
    obstore.put(host, "t", b"x")
    stamp = obstore.head(world.host("b"), "t")["last_modified"].timestamp()
    assert stamp == pytest.approx(world.now)
    world.advance(10.0)
    assert host.clock() == pytest.approx(world.now + 3600.0)
