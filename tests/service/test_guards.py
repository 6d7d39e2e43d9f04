"""API keys, start-up refusals, the queue limit and the request limit (429), and request
ids of `embedcache serve`."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from embedcache.service import wire
from tests.service.conftest import Server, random_seqs, run_cli

KEY = "s3cret-key-for-tests"


def guard_of(app, **limits):
    """The Guard in front of ``app`` in this process (no server), with ``limits``."""
    from embedcache.service.guards import Guard
    from embedcache.service.metrics import Metrics

    options = {"max_body_bytes": 10_000, "max_buffered_bytes": 100_000, **limits}
    routes = [wire.ROUTE_EMBED, wire.ROUTE_LIVE, wire.ROUTE_METRICS]
    return Guard(app, metrics=Metrics(), routes=routes, **options)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory, tiny_bert_dir):
    tmp = tmp_path_factory.mktemp("guarded")
    keys = tmp / "keys.txt"
    keys.write_text(f"# lab keys\nother-key\n{KEY}\n")
    keys.chmod(0o600)
    server = Server(
        [
            "--store",
            tmp / "store",
            "--model",
            f"bert={tiny_bert_dir}",
            "--api-key-file",
            keys,
            "--max-queue-tokens",
            "20000",
            "--token-budget",
            "64",  # one sequence a batch: a queue that drains slowly
            "--threads",
            "1",
        ],
        log_path=tmp / "server.log",
        key=KEY,
    )
    yield server
    assert server.stop() == 0, server.log()
    assert KEY not in server.log()


def test_every_route_but_health_needs_a_key(guarded):
    body = {"model": "bert", "sequences": ["ACGT"]}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        with httpx.Client(base_url=guarded.url, headers=headers) as client:
            for reply in (
                client.post(wire.ROUTE_EMBED, json=body),
                client.get(wire.ROUTE_MODELS),
                client.get(wire.ROUTE_METRICS),
                client.get(wire.ROUTE_OPENAPI),
            ):
                assert reply.status_code == 401, reply.text
                assert reply.json()["error"]["type"] == "authentication_error"
                assert reply.headers["www-authenticate"] == "Bearer"
                assert KEY not in reply.text
            assert client.get(wire.ROUTE_READY).status_code == 200
            assert client.get(wire.ROUTE_LIVE).status_code == 200
    with guarded.client() as client:
        assert client.post(wire.ROUTE_EMBED, json=body).status_code == 200
    other = {"Authorization": "Bearer other-key"}
    assert (
        httpx.get(f"{guarded.url}{wire.ROUTE_MODELS}", headers=other).status_code == 200
    )


def test_a_full_queue_answers_429_with_retry_after(guarded):
    first = random_seqs(300, seed=11, low=58, high=62)  # ~18k of the 20k tokens
    second = random_seqs(100, seed=12, low=58, high=62)
    replies = {}

    def ask(name, seqs):
        with guarded.client() as client:
            replies[name] = client.post(
                wire.ROUTE_EMBED, json={"model": "bert", "sequences": seqs}
            )

    big = threading.Thread(target=ask, args=("first", first))
    big.start()
    deadline = time.monotonic() + 30
    while guarded.metric("embedcache_queue_tokens", "bert") == 0:
        assert time.monotonic() < deadline
        assert big.is_alive()
        time.sleep(0.01)
    ask("second", second)
    big.join()
    assert replies["first"].status_code == 200
    full = replies["second"]
    assert full.status_code == 429, full.text
    assert int(full.headers["retry-after"]) >= 1
    assert "20000" in full.json()["error"]["message"]
    # over the whole limit at once: never fits, so 413 rather than a retry loop
    with guarded.client() as client:
        huge = client.post(
            wire.ROUTE_EMBED,
            json={
                "model": "bert",
                "sequences": random_seqs(400, seed=13, low=58, high=62),
            },
        )
    assert huge.status_code == 413, huge.text


def test_a_key_file_other_users_can_read_is_refused(tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text(f"{KEY}\n")
    keys.chmod(0o644)
    done = run_cli(
        "serve", "--model", "kmer-4", "--store", tmp_path / "s", "--api-key-file", keys
    )
    assert done.returncode == 2
    assert "chmod 600" in done.stderr
    assert KEY not in done.stderr + done.stdout


def test_a_public_bind_without_keys_is_refused(tmp_path):
    done = run_cli(
        "serve", "--model", "kmer-4", "--store", tmp_path / "s", "--host", "0.0.0.0"
    )
    assert done.returncode == 2
    assert "--allow-unauthenticated" in done.stderr


def test_tls_files_pass_through_to_uvicorn(tmp_path):
    import shutil
    import ssl
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            key,
            "-out",
            cert,
        ],
        check=True,
        capture_output=True,
    )
    context = ssl.create_default_context(cafile=str(cert))
    server = Server(
        [
            "--store",
            tmp_path / "s",
            "--model",
            "kmer-4",
            "--ssl-certfile",
            cert,
            "--ssl-keyfile",
            key,
        ],
        log_path=tmp_path / "server.log",
        scheme="https",
        verify=context,
    )
    try:
        reply = httpx.post(
            f"{server.url}{wire.ROUTE_EMBED}",
            json={"model": "kmer-4", "sequences": ["ACGTACGT"]},
            verify=context,
        )
        assert reply.status_code == 200
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{server.port}{wire.ROUTE_LIVE}", timeout=5)
    finally:
        assert server.stop() == 0


def test_bodies_beyond_the_server_wide_buffer_bound_get_503_and_are_released():
    import asyncio

    async def echo(scope, receive, send):
        body = (await receive())["body"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(len(body)).encode()})

    guard = guard_of(echo, max_body_bytes=10_000, max_buffered_bytes=3_000)

    async def ask():
        transport = httpx.ASGITransport(app=guard)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://x"
        ) as client:
            small = await client.post(wire.ROUTE_EMBED, content=b"a" * 2_000)
            big = await client.post(wire.ROUTE_EMBED, content=b"a" * 5_000)
            return small, big

    small, big = asyncio.run(ask())
    assert small.status_code == 200
    assert small.text == "2000"
    assert small.headers[wire.HEADER_REQUEST_ID]
    assert big.status_code == 503, big.text
    assert big.json()["error"]["type"] == "unavailable"
    assert guard.buffered == 0


def blocking_app():
    """An ASGI app whose /v1/embed waits for ``release``; other routes answer."""
    release = asyncio.Event()

    async def app(scope, receive, send):
        await receive()
        if scope["path"] == wire.ROUTE_EMBED:
            await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return app, release


def test_the_request_limit_answers_json_429_and_spares_health_and_metrics():
    app, release = blocking_app()
    guard = guard_of(app, limit_requests=2)

    async def ask():
        transport = httpx.ASGITransport(app=guard)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as c:
            held = [asyncio.ensure_future(c.post(wire.ROUTE_EMBED)) for _ in range(2)]
            while guard.in_flight < 2:
                await asyncio.sleep(0.01)
            refused = await c.post(wire.ROUTE_EMBED, headers={"X-Request-Id": "ab-1"})
            spared = [await c.get(r) for r in (wire.ROUTE_LIVE, wire.ROUTE_METRICS)]
            release.set()
            done = await asyncio.gather(*held)
            after = await c.post(wire.ROUTE_EMBED)
            return refused, spared, done, after

    refused, spared, done, after = asyncio.run(ask())
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["type"] == "queue_full"
    assert "limit of 2 requests" in refused.json()["error"]["message"]
    assert refused.json()["error"]["request_id"] == "ab-1"
    assert refused.headers[wire.HEADER_REQUEST_ID] == "ab-1"
    assert [r.status_code for r in spared] == [200, 200]
    assert [r.status_code for r in done] == [200, 200]
    assert after.status_code == 200
    assert guard.in_flight == 0


def test_a_request_id_is_taken_from_the_client_or_made():
    app, release = blocking_app()
    release.set()
    guard = guard_of(app)

    async def ask(headers):
        transport = httpx.ASGITransport(app=guard)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as c:
            return (await c.get(wire.ROUTE_LIVE, headers=headers)).headers

    assert asyncio.run(ask({"X-Request-Id": "lb-7f3a:01"}))["x-request-id"] == (
        "lb-7f3a:01"
    )
    for bad in ("", "has space", "x" * 129, "new\tline"):
        made = asyncio.run(ask({"X-Request-Id": bad}))["x-request-id"]
        assert made != bad
        assert len(made) == 16
    assert asyncio.run(ask({}))["x-request-id"] != asyncio.run(ask({}))["x-request-id"]
