"""The event loop only routes: clients pulling 10,000-vector JSON answers do not
hold a cached one-sequence request behind their encoding.

A ratio against the same request's time alone on the same server, generous for a
loaded 2-core machine: with the encoding on the loop it was ~1000x (2.7 s against
~3 ms); docs/design/serve-event-loop.md has the figures.
"""

from __future__ import annotations

import statistics
import threading
import time

import httpx

from embedcache.service import wire
from tests.service.conftest import Server, random_seqs

N_BIG = 10_000
BOUND = 40  # the loaded median over the alone median


def timed(client, body, n):
    times = []
    for _ in range(n):
        start = time.perf_counter()
        reply = client.post(wire.ROUTE_EMBED, json=body)
        times.append(time.perf_counter() - start)
        assert reply.status_code == 200, reply.text
    return statistics.median(times)


def test_big_json_answers_do_not_hold_a_cached_one_sequence_request(tmp_path):
    server = Server(
        ["--store", tmp_path / "store", "--model", "kmer-4", "--threads", "1"],
        log_path=tmp_path / "server.log",
    )
    big = {"model": "kmer-4", "sequences": random_seqs(N_BIG, seed=61)}
    one = {"model": "kmer-4", "sequences": big["sequences"][:1]}
    stop, pulled = threading.Event(), []

    def pull():
        with httpx.Client(base_url=server.url, timeout=120) as client:
            while not stop.is_set():
                reply = client.post(wire.ROUTE_EMBED, json=big)
                pulled.append(len(reply.content))  # bytes only: no parsing here

    try:
        with server.client() as client:
            assert client.post(wire.ROUTE_EMBED, json=big).status_code == 200
            alone = timed(client, one, 15)
            pullers = [threading.Thread(target=pull) for _ in range(3)]
            for thread in pullers:
                thread.start()
            while len(pulled) < 1:  # the pullers are in their stride
                time.sleep(0.05)
            loaded = timed(client, one, 15)
            stop.set()
            for thread in pullers:
                thread.join(120)
    finally:
        stop.set()
        assert server.stop() == 0
    assert min(pulled) > N_BIG * 256 * 4  # 10,000 x 256 floats as JSON text
    assert loaded < BOUND * alone, (loaded, alone)
