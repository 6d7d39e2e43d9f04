"""The batcher in-process: pass-by-pass order, an earlier round taking over, and
dropped work of a request that left. The forward step is the real one, held at a
chosen pass so the test decides what arrives while it runs."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest

from embedcache.engine.batching import BatchRule
from embedcache.errors import CorruptStoreError, StoreUnavailableError
from embedcache.hashing import sequence_key
from embedcache.models import load_adapter
from embedcache.service import batcher as batcher_module
from embedcache.service.batcher import Batcher
from embedcache.service.errors import (
    BackendFaultError,
    SequenceFailedError,
    ServerFaultError,
    ServiceUnavailableError,
    StoreCorruptError,
    StoreFaultError,
)
from embedcache.service.metrics import Metrics
from embedcache.store import EmbeddingStore

from .conftest import random_seqs

TOKENS = 10  # each test sequence counts as this many tokens
BUDGET = 20  # two sequences a pass


class HeldForward:
    """Records each pass's sequences; the pass numbered ``hold`` waits for
    ``release`` after announcing itself on ``reached``."""

    def __init__(self, hold: int) -> None:
        self.hold = hold
        self.passes: list[tuple[str, ...]] = []
        self.on_pass = lambda seqs: None
        self.reached = threading.Event()
        self.release = threading.Event()
        self.real = batcher_module.run_unit

    def __call__(self, adapter, store, unit):
        self.passes.append(unit.seqs)
        self.on_pass(unit.seqs)
        if len(self.passes) == self.hold:
            self.reached.set()
            assert self.release.wait(30)
        return self.real(adapter, store, unit)


@pytest.fixture
def make_batcher(tmp_path):
    made = []

    def make(forward: HeldForward, monkeypatch) -> tuple[Batcher, EmbeddingStore]:
        monkeypatch.setattr(batcher_module, "run_unit", forward)
        adapter = load_adapter("kmer-4")
        model = SimpleNamespace(
            name="kmer", adapter=adapter, rule=BatchRule(token_budget=BUDGET)
        )
        store = EmbeddingStore(tmp_path / "store")
        batcher = Batcher(
            model, store, metrics=Metrics(), max_queue_tokens=10_000, window_seconds=0
        )
        made.append(batcher)
        return batcher, store

    yield make
    for batcher in made:
        batcher.stop()
        batcher.join(10)


def submit(batcher: Batcher, seqs: list[str]):
    digests = [sequence_key(s) for s in seqs]
    return batcher.submit(seqs, digests, [TOKENS] * len(seqs))


def test_a_small_request_waits_for_the_pass_in_flight_not_the_stream(
    make_batcher, monkeypatch
):
    # a stream of 8 sequences is 4 passes of one window; a one-sequence request
    # arrives during the stream's second pass and runs right after it
    forward = HeldForward(hold=2)
    batcher, store = make_batcher(forward, monkeypatch)
    stream, small = random_seqs(8, seed=1), random_seqs(1, seed=3)
    tickets = [submit(batcher, stream)]
    batcher.start()
    assert forward.reached.wait(30)
    tickets.append(submit(batcher, small))
    forward.release.set()
    for ticket in tickets:
        ticket.future.result(timeout=30)

    assert forward.passes[2] == tuple(small)
    ran = [s for batch in forward.passes for s in batch]
    assert sorted(ran) == sorted(stream + small)  # each sequence computed once
    assert len(forward.passes) == 5
    (key,) = store.keys()
    vectors, found = store.get(key.key, [sequence_key(s) for s in stream + small])
    assert found.all()
    assert np.isfinite(vectors).all()


def test_a_flow_of_small_requests_does_not_starve_a_stream(make_batcher, monkeypatch):
    # a new one-sequence request arrives during every pass: each is due after the
    # pass in flight, but every pass moves the clock on, so the stream's next pass
    # comes due after one budget of the small requests' work (two of them here)
    forward = HeldForward(hold=0)
    batcher, _ = make_batcher(forward, monkeypatch)
    stream = random_seqs(8, seed=1)
    smalls = iter(random_seqs(12, seed=7))
    tickets = [submit(batcher, stream)]

    def arrive(seqs):
        if len(forward.passes) <= 12:
            tickets.append(submit(batcher, [next(smalls)]))

    forward.on_pass = arrive
    batcher.start()
    deadline = time.monotonic() + 60
    while not tickets[0].future.done():
        assert time.monotonic() < deadline, "the stream was starved"
        time.sleep(0.01)
    stream_passes = [
        n for n, seqs in enumerate(forward.passes) if set(seqs) <= set(stream)
    ]
    assert len(stream_passes) == 4
    # between two of the stream's passes, at most one budget of small requests ran
    gaps = np.diff(stream_passes) - 1
    assert gaps.max() <= BUDGET // TOKENS, forward.passes
    assert gaps.min() >= 1  # and the small ones were not kept waiting either


def test_passes_nobody_waits_for_any_more_are_dropped(make_batcher, monkeypatch):
    # one window, two passes: the first holds `first`'s sequences, the second
    # `leaving`'s, whose request is cancelled while the first pass runs
    forward = HeldForward(hold=1)
    batcher, store = make_batcher(forward, monkeypatch)
    first, leaving = random_seqs(2, seed=4), random_seqs(2, seed=5)
    kept = submit(batcher, first)
    gone = submit(batcher, leaving)
    batcher.start()
    assert forward.reached.wait(30)
    batcher.cancel(gone)
    forward.release.set()
    kept.future.result(timeout=30)
    batcher.stop()
    assert batcher.join(30)

    assert forward.passes == [tuple(first)]
    dropped = batcher.metrics.dropped.labels("kmer")._value.get()
    assert dropped == 2
    (key,) = store.keys()
    _, found = store.get(key.key, [sequence_key(s) for s in first + leaving])
    assert found.tolist() == [True, True, False, False]


def test_a_store_fault_fails_its_window_and_the_thread_lives_on(
    make_batcher, monkeypatch
):
    forward = HeldForward(hold=0)
    batcher, store = make_batcher(forward, monkeypatch)
    real, calls = store.contains, []

    def contains(key, hashes):  # the bucket down once, as after obstore's retries
        calls.append(hashes)
        if len(calls) == 1:
            msg = "s3://lab-bucket/embeddings: connection refused"
            raise StoreUnavailableError(msg)
        return real(key, hashes)

    monkeypatch.setattr(store, "contains", contains)
    seqs = random_seqs(2, seed=8)
    failed = submit(batcher, seqs)
    batcher.start()
    with pytest.raises(ServerFaultError) as caught:
        failed.future.result(timeout=30)
    assert caught.value.status == 503
    assert "lab-bucket" not in str(caught.value)
    assert batcher.alive
    submit(batcher, seqs).future.result(timeout=30)
    assert forward.passes == [tuple(seqs)]


def test_a_failing_sequence_fails_alone_and_its_pass_mates_are_computed(
    make_batcher, monkeypatch
):
    forward = HeldForward(hold=0)
    bad = random_seqs(1, seed=9)[0]

    def on_pass(seqs):
        if bad in seqs:
            msg = "the model failed"
            raise RuntimeError(msg)

    forward.on_pass = on_pass
    batcher, store = make_batcher(forward, monkeypatch)
    mine, other = [*random_seqs(1, seed=10), bad], random_seqs(2, seed=11)
    tickets = [submit(batcher, mine), submit(batcher, other)]
    batcher.start()
    with pytest.raises(SequenceFailedError) as caught:
        tickets[0].future.result(timeout=30)
    assert caught.value.digest == sequence_key(bad)
    tickets[1].future.result(timeout=30)
    (key,) = store.keys()
    _, found = store.get(key.key, [sequence_key(s) for s in mine + other])
    assert found.tolist()[1:] == [False, True, True]
    assert batcher.alive


def test_a_stopped_thread_answers_503_and_is_not_alive(make_batcher, monkeypatch):
    batcher, _ = make_batcher(HeldForward(hold=0), monkeypatch)
    waiting = submit(batcher, random_seqs(2, seed=12))

    def broken():
        msg = "a bug outside the window's guard"
        raise RuntimeError(msg)

    monkeypatch.setattr(batcher, "_take_window", broken)
    batcher.start()
    with pytest.raises(ServiceUnavailableError):
        waiting.future.result(timeout=30)
    assert batcher.join(30)
    assert not batcher.alive
    assert not batcher.live  # /health/live fails: restart me
    with pytest.raises(ServiceUnavailableError):
        submit(batcher, random_seqs(1, seed=13))


def wait_until(condition, what, timeout=30):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_failing_device_is_the_backends_fault_and_opens_the_breaker(
    make_batcher, monkeypatch
):
    forward = HeldForward(hold=0)
    batcher, _ = make_batcher(forward, monkeypatch)
    batcher.breaker.probe_seconds = 0.05
    batcher.start()
    wait_until(lambda: batcher.warm, "no warm-up")
    adapter = batcher.model.adapter
    real = adapter.embed_batch

    def broken(seqs):
        msg = "the device failed"
        raise RuntimeError(msg)

    monkeypatch.setattr(adapter, "embed_batch", broken)
    for seed in range(3):  # three failed passes, each with its canary
        ticket = submit(batcher, random_seqs(4, seed=20 + seed))
        with pytest.raises(BackendFaultError) as caught:  # never a sequence's 422
            ticket.future.result(timeout=30)
        assert caught.value.status == 424
    assert batcher.breaker.open
    assert "canary" in batcher.trouble()
    with pytest.raises(ServiceUnavailableError):
        submit(batcher, random_seqs(1, seed=30))
    assert batcher.live  # not a restart: it may heal

    monkeypatch.setattr(adapter, "embed_batch", real)
    wait_until(lambda: not batcher.breaker.open, "the canary never closed it")
    assert batcher.trouble() is None
    submit(batcher, random_seqs(4, seed=31)).future.result(timeout=30)


def test_a_sticky_device_error_fails_everything_and_calls_on_fatal(
    make_batcher, monkeypatch
):
    forward = HeldForward(hold=0)
    batcher, _ = make_batcher(forward, monkeypatch)
    lost = threading.Event()
    batcher.on_fatal = lost.set
    batcher.start()
    wait_until(lambda: batcher.warm, "no warm-up")

    def sticky(seqs):
        msg = "CUDA error: an illegal memory access was encountered"
        raise RuntimeError(msg)

    monkeypatch.setattr(batcher.model.adapter, "embed_batch", sticky)
    with pytest.raises(BackendFaultError):
        submit(batcher, random_seqs(4, seed=32)).future.result(timeout=30)
    assert lost.wait(30)
    assert batcher.join(30)
    assert not batcher.live
    assert "illegal memory access" in batcher.trouble()


def test_any_store_error_on_commit_is_a_store_fault_without_bisecting(
    make_batcher, monkeypatch
):
    import obstore.exceptions

    forward = HeldForward(hold=0)
    batcher, store = make_batcher(forward, monkeypatch)

    def denied(*args, **kwargs):
        msg = "403 Forbidden: expired credentials"
        raise obstore.exceptions.PermissionDeniedError(msg)

    monkeypatch.setattr(store, "put", denied)
    ticket = submit(batcher, random_seqs(4, seed=33))
    batcher.start()
    with pytest.raises(StoreFaultError) as caught:
        ticket.future.result(timeout=30)
    assert caught.value.status == 503
    assert len(forward.passes) == 1  # one pass: nothing halved, nobody blamed


def test_damage_the_store_cannot_skip_is_500_store_corrupt(make_batcher, monkeypatch):
    forward = HeldForward(hold=0)
    batcher, store = make_batcher(forward, monkeypatch)
    damage = CorruptStoreError("the key's group document fails its checks")
    monkeypatch.setattr(store, "contains", mock.Mock(side_effect=damage))
    batcher.start()
    with pytest.raises(StoreCorruptError) as caught:
        submit(batcher, random_seqs(2, seed=34)).future.result(timeout=30)
    assert (caught.value.status, caught.value.error_type) == (500, "store_corrupt")
    assert not forward.passes


def test_a_corrupt_run_is_set_aside_by_the_store_and_its_rows_computed_again(
    make_batcher, monkeypatch, tmp_path
):
    """The service leaves quarantine to the store: a run failing its checks is
    skipped on read, its sequences are computed again and the request succeeds."""
    first, second = random_seqs(2, seed=35), random_seqs(2, seed=36)
    batcher, store = make_batcher(HeldForward(hold=0), monkeypatch)
    batcher.start()
    for seqs in (first, second):  # one run each
        submit(batcher, seqs).future.result(timeout=30)
    view = store._view(store.keys()[0].key)
    damaged = view.runs[0].record.run  # the first request's run
    # its sorted index: what the batcher's look-up of stored sequences reads
    (chunk,) = (tmp_path / "store").glob(f"*/shards/{damaged}/sorted_hashes/c/0/0")
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x40
    chunk.write_bytes(bytes(data))

    forward = HeldForward(hold=0)
    batcher, store = make_batcher(forward, monkeypatch)  # a fresh process's store
    batcher.start()
    submit(batcher, first + second).future.result(timeout=30)
    assert sorted(s for p in forward.passes for s in p) == sorted(first)
    assert store.n_quarantined == 1
    assert store.contains(store.keys()[0].key, [sequence_key(s) for s in first]).all()
