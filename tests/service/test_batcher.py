"""The batcher in-process: pass-by-pass order, an earlier round taking over, and
dropped work of a request that left. The forward step is the real one, held at a
chosen pass so the test decides what arrives while it runs."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest

from embedcache.engine.batching import BatchRule
from embedcache.hashing import sequence_key
from embedcache.models import load_adapter
from embedcache.service import batcher as batcher_module
from embedcache.service.batcher import Batcher
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
        self.reached = threading.Event()
        self.release = threading.Event()
        self.real = batcher_module.run_unit

    def __call__(self, adapter, store, unit):
        self.passes.append(unit.seqs)
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


def test_an_earlier_round_takes_over_between_two_passes_of_a_window(
    make_batcher, monkeypatch
):
    # two large requests: rounds of two sequences; a window holds one round of both,
    # two passes. The third pass is round 1's first: a small request arrives then.
    forward = HeldForward(hold=3)
    batcher, store = make_batcher(forward, monkeypatch)
    a, b, small = random_seqs(6, seed=1), random_seqs(6, seed=2), random_seqs(1, seed=3)
    tickets = [submit(batcher, a), submit(batcher, b)]
    batcher.start()
    assert forward.reached.wait(30)
    tickets.append(submit(batcher, small))
    forward.release.set()
    for ticket in tickets:
        ticket.future.result(timeout=30)

    assert set(forward.passes[2]) <= set(a[2:4] + b[2:4])
    # the small request ran right after the pass in flight, before round 1 finished
    assert forward.passes[3] == tuple(small)
    assert set(forward.passes[4]) <= set(a[2:4] + b[2:4])
    ran = [s for batch in forward.passes for s in batch]
    assert sorted(ran) == sorted(a + b + small)  # each sequence computed once
    (key,) = store.keys()
    vectors, found = store.get(key.key, [sequence_key(s) for s in a + b + small])
    assert found.all()
    assert np.isfinite(vectors).all()


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
