"""Admission by requests, not connections: sockets that never send (or never finish)
a request hold no place and read deadlines close them, so the health routes answer
(issue 42, finding 1); a body's sequences are counted before it is parsed. The
request limit itself (429) is tested with the Guard in test_guards.py."""

from __future__ import annotations

import contextlib
import socket
import time
import tracemalloc
from pathlib import Path

import httpx
import pytest

from embedcache.service import wire
from embedcache.service.errors import RequestTooLargeError
from embedcache.service.schemas import check_list_length
from tests.service.conftest import Server, free_port, random_seqs


def connect(server):
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def hostile_sockets(server):
    """Two silent sockets, one that sends half a body, three idle keep-alives."""
    silent = [connect(server) for _ in range(2)]
    half_body = connect(server)
    half_body.sendall(
        b"POST /v1/embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n{"
    )
    idle = []
    for _ in range(3):
        sock = connect(server)
        sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"200" in sock.recv(4096).split(b"\r\n", 1)[0]
        idle.append(sock)
    return [*silent, half_body, *idle]


def closed_by_server(sock, within):
    """Whether the server closes ``sock`` within ``within`` seconds (EOF or reset)."""
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionError:
        return True
    return True


def peak_rss_mib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    pytest.skip("needs /proc/<pid>/status (Linux)")


def test_idle_and_unfinished_sockets_do_not_take_the_routes_down(tmp_path):
    metrics_port = free_port()
    server = Server(
        [
            *("--store", tmp_path / "store", "--model", "kmer-4"),
            *("--limit-concurrency", "4", "--threads", "1"),
            *("--metrics-port", metrics_port),
        ],
        log_path=tmp_path / "server.log",
    )
    seqs = random_seqs(8, seed=42)
    body = {"model": "kmer-4", "sequences": seqs}
    socks = []
    try:
        assert httpx.post(server.url + wire.ROUTE_EMBED, json=body).status_code == 200
        socks = hostile_sockets(server)
        for _ in range(2):  # at once, and once the sockets have sat a while
            with httpx.Client(base_url=server.url, timeout=10) as client:
                for route in (wire.ROUTE_LIVE, wire.ROUTE_READY, wire.ROUTE_METRICS):
                    reply = client.get(route)
                    assert reply.status_code == 200, (route, reply.text)
                cached = client.post(wire.ROUTE_EMBED, json=body)
                assert cached.status_code == 200, cached.text
                assert cached.json()["n_cached"] == len(seqs)
            # and on the metrics port of its own, as TEI's --prometheus-port
            scrape = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10)
            assert scrape.status_code == 200
            assert 'embedcache_requests_total{route="/v1/embed",status="200"}' in (
                scrape.text
            )
            time.sleep(1.5)

        # a 16 MiB body of one-letter sequences: 413 before it is parsed (parsed,
        # it was ~1.5 M Python strings, +92 MiB at the peak)
        before = peak_rss_mib(server.proc.pid)
        n = (16 * 2**20 - 64) // 4
        huge = b'{"model":"kmer-4","sequences":[' + b",".join([b'"A"'] * n) + b"]}"
        reply = httpx.post(
            server.url + wire.ROUTE_EMBED,
            content=huge,
            headers={"Content-Type": "application/json"},
            timeout=60,
        )
        assert reply.status_code == 413, reply.text
        assert "10000" in reply.json()["error"]["message"]
        grown = peak_rss_mib(server.proc.pid) - before
        # the body is held two or three times over (the protocol's buffer, the
        # chunks, joined): ~50 MiB; parsed first, it was +241 MiB (a0b9f37)
        assert grown < 120, f"peak RSS grew {grown:.0f} MiB"
    finally:
        for sock in socks:
            sock.close()
        assert server.stop() == 0, server.log()
    assert "Traceback" not in server.log()


def test_read_deadlines_close_sockets_that_never_finish_a_request(tmp_path):
    server = Server(
        [
            *("--store", tmp_path / "store", "--model", "kmer-4"),
            *("--header-timeout", "1", "--body-timeout", "1"),
            *("--keep-alive-timeout", "1"),
        ],
        log_path=tmp_path / "server.log",
    )
    try:
        silent, half_headers, half_body = (
            connect(server),
            connect(server),
            connect(server),
        )
        half_headers.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n")
        half_body.sendall(
            b"POST /v1/embed HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"
        )
        idle = connect(server)
        idle.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert idle.recv(4096).startswith(b"HTTP/1.1 200")
        # a keep-alive that starts a second request and stops halfway
        again = connect(server)
        again.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert again.recv(4096).startswith(b"HTTP/1.1 200")
        again.sendall(b"GET /health/live HTTP/1.1\r\n")
        started = time.monotonic()
        for sock in (silent, half_headers, half_body, idle, again):
            with contextlib.closing(sock):
                assert closed_by_server(sock, within=10)
        assert time.monotonic() - started < 10
        # a client that keeps sending its body in time is not cut off
        slow = connect(server)
        with contextlib.closing(slow):
            slow.sendall(
                b"POST /v1/embed HTTP/1.1\r\nHost: x\r\nContent-Length: 44\r\n"
                b"Content-Type: application/json\r\n\r\n"
            )
            time.sleep(0.5)
            slow.sendall(b'{"model": "kmer-4", "sequences": ["ACGTAC"]}')
            assert slow.recv(4096).startswith(b"HTTP/1.1 200")
    finally:
        assert server.stop() == 0, server.log()
    assert "no complete request headers within 1 s" in server.log()
    assert "no complete request body within 1 s" in server.log()
    assert "Traceback" not in server.log()


def test_sequences_are_counted_before_the_body_is_parsed():
    n = (16 * 2**20 - 64) // 4
    huge = b'{"model":"kmer-4","sequences":[' + b",".join([b'"A"'] * n) + b"]}"
    tracemalloc.start()
    try:
        started = time.perf_counter()
        with pytest.raises(RequestTooLargeError, match="more than 10000 sequences"):
            check_list_length(huge, field="sequences", limit=10_000)
        seconds = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20
    assert seconds < 1.0

    # the scan refuses early, a little past the limit (the exact count follows the
    # parse): keys and escaped quotes in the strings do not confuse it
    def body(n, *, tail=b""):
        items = b", ".join([b'"A\\"C"'] + [b'"ACGT"'] * (n - 1))
        return b'{"model": "kmer-4", "sequences": [' + items + b"]" + tail + b"}"

    check_list_length(body(100, tail=b', "user": "x"'), field="sequences", limit=100)
    with pytest.raises(RequestTooLargeError):
        check_list_length(body(150), field="sequences", limit=100)
    # the other route's field: a list under another key is not the sequences
    check_list_length(body(150), field="input", limit=100)
    # values hidden elsewhere (an ignored field, nested lists) cannot dodge it
    many = b",".join([b'"A"'] * 1000)
    for hidden in (
        b'{"model": "m", "user": [' + many + b'], "input": []}',
        b'{"model": "m", "input": ["A", [], ' + many + b"]}",
        b'{"model": "m", "input": ["A", {"a": []}, ' + many + b"]}",
    ):
        with pytest.raises(RequestTooLargeError):
            check_list_length(hidden, field="input", limit=100)


@pytest.mark.parametrize("body", [{"input": []}, {"sequences": []}])
def test_an_empty_list_of_sequences_is_400(served, body):
    route = wire.ROUTE_EMBEDDINGS if "input" in body else wire.ROUTE_EMBED
    with served.client() as client:
        reply = client.post(route, json={"model": "kmer-4", **body})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["type"] == "invalid_request"
    message = reply.json()["error"]["message"]
    assert "empty list; give at least one sequence" in message
    assert next(iter(body)) in message
