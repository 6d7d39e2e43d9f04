"""What a server says about a request: the client's X-Request-Id in the reply and in
every log line of the request, never a sequence's bases (lengths and indices only),
and the time of each stage in /metrics (issue 42, finding 6)."""

from __future__ import annotations

import re

import httpx

from embedcache.service import wire
from embedcache.service.metrics import STAGES
from tests.service.conftest import Server, random_seqs
from tests.service.poisoned_serve import MARKER


def test_the_request_id_is_kept_and_no_log_line_carries_bases(tmp_path):
    server = Server(
        ["--store", tmp_path / "store", "--model", "kmer-4"],
        log_path=tmp_path / "server.log",
        module="tests.service.poisoned_serve",
    )
    seqs = random_seqs(4, seed=80, low=40, high=50)
    poisoned = [*seqs, MARKER + "ACGTTGCA" * 4]
    try:
        good = httpx.post(
            server.url + wire.ROUTE_EMBED,
            json={"model": "kmer-4", "sequences": seqs},
            headers={"X-Request-Id": "trace-good-1"},
            timeout=60,
        )
        bad = httpx.post(
            server.url + wire.ROUTE_EMBED,
            json={"model": "kmer-4", "sequences": poisoned},
            headers={"X-Request-Id": "trace-bad-2"},
            timeout=60,
        )
        made = httpx.get(server.url + wire.ROUTE_LIVE)
    finally:
        assert server.stop() == 0
    log = server.log()
    assert good.status_code == 200, good.text
    assert good.headers[wire.HEADER_REQUEST_ID] == "trace-good-1"
    assert bad.status_code != 200
    assert bad.headers[wire.HEADER_REQUEST_ID] == "trace-bad-2"
    assert bad.json()["error"]["request_id"] == "trace-bad-2"
    assert re.fullmatch(r"[0-9a-f]{16}", made.headers[wire.HEADER_REQUEST_ID])
    # every line about the failed request names it; the access lines name both
    assert re.search(r"POST /v1/embed 200 [\d.]+ ms request trace-good-1", log)
    failing = [line for line in log.splitlines() if "failed" in line]
    assert failing
    assert all("trace-bad-2" in line for line in failing), failing
    for seq in poisoned:
        assert seq[:12] not in log
    assert MARKER[:12] not in log


def stage_counts(text, model):
    counts = {}
    for line in text.splitlines():
        found = re.match(
            r'embedcache_stage_seconds_count\{model="([^"]+)",stage="(\w+)"\} (\S+)',
            line,
        )
        if found and found.group(1) == model:
            counts[found.group(2)] = float(found.group(3))
    return counts


def test_each_stage_of_a_miss_is_timed_in_metrics(served):
    seqs = random_seqs(5, seed=81)
    with served.client() as client:
        reply = client.post(
            wire.ROUTE_EMBED, json={"model": "kmer-4", "sequences": seqs}
        )
        assert reply.status_code == 200, reply.text
        counts = stage_counts(client.get(wire.ROUTE_METRICS).text, "kmer-4")
    assert set(counts) == set(STAGES)
    assert counts["queue"] >= len(seqs)  # one a sequence
    assert all(count >= 1 for count in counts.values()), counts
