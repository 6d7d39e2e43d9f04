"""A forward failure caused by one request's sequence fails that request alone, and
no error reply carries anything of the other requests; a request past its deadline
gets 504 and its queued work is dropped."""

from __future__ import annotations

import threading
import time

import httpx
import numpy as np

from embedcache.models import load_adapter
from embedcache.service import wire
from tests.service.conftest import Server, random_seqs
from tests.service.poisoned_serve import MARKER, SLOW, SLOW_SECONDS


def test_one_poisoned_sequence_fails_only_its_own_request(tmp_path):
    store = tmp_path / "store"
    server = Server(
        # a long window and a large budget: the four requests share one pass
        ["--store", store, "--model", "kmer-4", "--batch-window-ms", "400"],
        log_path=tmp_path / "server.log",
        module="tests.service.poisoned_serve",
    )
    poison = MARKER + "ACGTTGCA" * 4
    bodies = {name: random_seqs(6, seed=50 + i) for i, name in enumerate("abcd")}
    bodies["c"][2] = poison
    replies = {}

    def ask(name):
        replies[name] = httpx.post(
            f"{server.url}{wire.ROUTE_EMBED}",
            json={"model": "kmer-4", "sequences": bodies[name]},
            timeout=60,
        )

    try:
        threads = [threading.Thread(target=ask, args=(name,)) for name in bodies]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        log = server.log()
    finally:
        assert server.stop() == 0
    failed = replies.pop("c")
    assert failed.status_code == 422, failed.text
    error = failed.json()["error"]
    assert error["index"] == 2
    assert "sequences[2]" in error["message"]
    assert error["request_id"] == failed.headers[wire.HEADER_REQUEST_ID]
    for other in ("a", "b", "d"):
        for seq in bodies[other]:
            assert seq not in failed.text
    assert str(store) not in failed.text
    # the log line names the request and holds the whole error
    assert error["request_id"] in log
    assert "non-finite" in log
    kmer = load_adapter("kmer-4")
    for name, reply in replies.items():
        assert reply.status_code == 200, (name, reply.text)
        got = np.array([item["embedding"] for item in reply.json()["data"]])
        np.testing.assert_allclose(got, kmer.embed_batch(bodies[name]), rtol=1e-6)
        assert poison not in reply.text


def test_past_its_deadline_a_request_gets_504_and_its_queued_work_is_dropped(tmp_path):
    server = Server(
        # one sequence a pass: the slow one (the shortest) first, the rest queued
        [
            *("--store", tmp_path / "store", "--model", "kmer-4"),
            *("--token-budget", "64", "--request-timeout", "1"),
        ],
        log_path=tmp_path / "server.log",
        module="tests.service.poisoned_serve",
    )
    seqs = [SLOW, *random_seqs(20, seed=70, low=40, high=60)]
    try:
        start = time.monotonic()
        reply = httpx.post(
            f"{server.url}{wire.ROUTE_EMBED}",
            json={"model": "kmer-4", "sequences": seqs},
            timeout=60,
        )
        took = time.monotonic() - start
        deadline = time.monotonic() + SLOW_SECONDS + 10
        while server.metric("embedcache_sequences_dropped_total") < len(seqs) - 1:
            assert time.monotonic() < deadline, "the queued work was not dropped"
            time.sleep(0.1)
        time.sleep(0.5)
        computed = server.metric("embedcache_sequences_computed_total")
        dropped = server.metric("embedcache_sequences_dropped_total")
    finally:
        assert server.stop() == 0
    assert reply.status_code == 504, reply.text
    assert reply.json()["error"]["type"] == "timeout"
    assert took < SLOW_SECONDS
    assert dropped == len(seqs) - 1
    assert computed <= 1
