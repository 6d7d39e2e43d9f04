"""A bucket that goes down and comes back, under a real server: requests end by
their deadline with a JSON error, readiness turns false, and once the bucket answers
again new sequences are served, without a restart."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from embedcache.service import wire
from tests.faults.proxy import start_proxy
from tests.service.conftest import Server, random_seqs
from tests.store.conftest import CREDENTIALS, new_bucket, s3_endpoint

__all__ = ["s3_endpoint"]

DEADLINE = 4.0  # --request-timeout


def ready(server):
    return httpx.get(f"{server.url}{wire.ROUTE_READY}", timeout=5).status_code


def wait_for(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.fixture
def outage(s3_endpoint, tmp_path):
    proxy = start_proxy(s3_endpoint, seed=3)
    url = f"s3://{new_bucket(s3_endpoint)}/embeddings"
    env = {
        "AWS_ACCESS_KEY_ID": CREDENTIALS["aws_access_key_id"],
        "AWS_SECRET_ACCESS_KEY": CREDENTIALS["aws_secret_access_key"],
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": proxy.url,
        "AWS_ALLOW_HTTP": "true",
    }
    args = ["--store", url, "--model", "kmer-4", "--threads", "1"]
    limits = ["--request-timeout", DEADLINE, "--store-probe-seconds", "0.5"]
    server = Server([*args, *limits], log_path=tmp_path / "server.log", env=env)
    yield server, proxy, url
    proxy.calm()
    server.stop()
    proxy.stop()


def test_a_bucket_down_and_back_is_survived_without_a_restart(outage):
    server, proxy, url = outage
    warm = random_seqs(50, seed=31)
    with server.client() as client:
        reply = client.post(
            wire.ROUTE_EMBED, json={"model": "kmer-4", "sequences": warm}
        )
        assert reply.status_code == 200, reply.text

    # down: every request to the bucket refused or 503
    proxy.inject(rate=1.0, kinds=("refuse", "503"))
    replies, took = {}, {}

    def ask(name, seqs):
        start = time.monotonic()
        try:
            replies[name] = httpx.post(
                f"{server.url}{wire.ROUTE_EMBED}",
                json={"model": "kmer-4", "sequences": seqs},
                timeout=60,
            )
        finally:
            took[name] = time.monotonic() - start

    asking = [
        threading.Thread(target=ask, args=(f"new{i}", random_seqs(20, seed=40 + i)))
        for i in range(3)
    ]
    asking.append(threading.Thread(target=ask, args=("cached", warm[:5])))
    for thread in asking:
        thread.start()
    wait_for(
        lambda: ready(server) != 200, 15, "readiness stayed 200 with the bucket down"
    )
    for thread in asking:
        thread.join(60)
    assert proxy.n_faults > 0
    for name, reply in replies.items():
        assert took[name] < DEADLINE + 3, (name, took[name])
        assert reply.status_code in (503, 504), (name, reply.status_code, reply.text)
        error = reply.json()["error"]
        assert error["type"] in ("unavailable", "timeout")
        assert error["request_id"] == reply.headers[wire.HEADER_REQUEST_ID]
        assert url not in reply.text
        assert "embeddings" not in error["message"]

    # back: ready again, and new sequences computed, committed and served
    proxy.calm()
    wait_for(lambda: ready(server) == 200, 20, "not ready after the bucket came back")
    fresh = random_seqs(30, seed=77)
    start = time.monotonic()
    reply = httpx.post(
        f"{server.url}{wire.ROUTE_EMBED}",
        json={"model": "kmer-4", "sequences": fresh},
        timeout=60,
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["n_computed"] == len(fresh)
    assert time.monotonic() - start < 10
    assert server.proc.poll() is None
