"""Faults injected into a running server blame the right party (issue 42): a store
refusing credentials or holding corrupt data is the store's fault (503 / 500
``store_corrupt``), a device failing every batch the backend's (424, then not
ready until its canary passes), a sticky device error ends the process; never a
4xx blaming a sequence."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from embedcache.service import wire
from tests.service.conftest import Server, cli_env, free_port, random_seqs
from tests.service.faulty_serve import ENV

MODEL = "kmer-4"


def wait_for(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def start(tmp_path, *args):
    """A kmer-4 server whose faults the test switches with files in ``.flags``."""
    flags = tmp_path / "flags"
    flags.mkdir()
    server = Server(
        ["--store", tmp_path / "store", "--model", MODEL, "--threads", "1", *args],
        log_path=tmp_path / "server.log",
        module="tests.service.faulty_serve",
        env={ENV: str(flags)},
    )
    server.flags = flags
    return server


@pytest.fixture
def faulty(tmp_path):
    server = start(tmp_path)
    yield server
    server.stop()


def n_threads(pid):
    status = Path(f"/proc/{pid}/status").read_text()
    return int(
        next(
            line for line in status.splitlines() if line.startswith("Threads:")
        ).split()[1]
    )


def embed(server, seqs, timeout=60):
    return httpx.post(
        f"{server.url}{wire.ROUTE_EMBED}",
        json={"model": MODEL, "sequences": seqs},
        timeout=timeout,
    )


def status(server, route):
    return httpx.get(f"{server.url}{route}", timeout=5).status_code


def test_a_store_refusing_credentials_on_commit_is_a_store_fault(faulty):
    cached = random_seqs(4, seed=1)
    assert embed(faulty, cached).status_code == 200
    (faulty.flags / "put-denied").touch()

    reply = embed(faulty, random_seqs(8, seed=2))
    assert reply.status_code == 503, reply.text  # was 422 "sequences[0] ..."
    assert reply.headers["Retry-After"]
    error = reply.json()["error"]
    assert error["type"] == "unavailable"
    assert "index" not in error
    assert embed(faulty, cached).status_code == 200  # hits still served
    assert "PermissionDeniedError" in faulty.log()  # the cause, in the log only


def test_a_corrupt_store_is_500_store_corrupt_not_an_outage(faulty):
    (faulty.flags / "corrupt").touch()
    reply = embed(faulty, random_seqs(3, seed=3))
    assert reply.status_code == 500, reply.text  # was 503 + Retry-After
    assert reply.json()["error"]["type"] == wire.ERROR_STORE_CORRUPT
    assert "Retry-After" not in reply.headers
    assert "checksum" not in reply.text


def test_a_device_failing_every_batch_is_424_then_not_ready_then_heals(faulty):
    cached = random_seqs(4, seed=9)
    assert embed(faulty, cached).status_code == 200
    (faulty.flags / "forward").write_text("the device failed")
    replies = []

    def ask(seed):
        replies.append(embed(faulty, random_seqs(16, seed=seed)))

    asking = [threading.Thread(target=ask, args=(10 + i,)) for i in range(4)]
    faulted = time.monotonic()
    for thread in asking:
        thread.start()
    for thread in asking:
        thread.join(60)
    codes = sorted(reply.status_code for reply in replies)
    assert all(code in (424, 503) for code in codes), [r.text for r in replies]
    assert 424 in codes
    for reply in replies:
        assert "index" not in reply.json()["error"]
    # a few more failed batches open the breaker: not ready within 30 s
    while status(faulty, wire.ROUTE_READY) == 200:
        assert time.monotonic() - faulted < 30, "still ready with a failing device"
        reply = embed(faulty, random_seqs(2, seed=int(time.monotonic() * 1000)))
        assert reply.status_code in (424, 503), reply.text
    assert status(faulty, wire.ROUTE_LIVE) == 200  # not a restart: it may heal
    assert embed(faulty, cached).status_code == 200  # hits need no model

    (faulty.flags / "forward").unlink()
    cleared = time.monotonic()
    wait_for(
        lambda: status(faulty, wire.ROUTE_READY) == 200,
        60,
        "not ready within 60 s of the device healing",
    )
    reply = embed(faulty, random_seqs(16, seed=20))
    assert reply.status_code == 200, reply.text
    assert time.monotonic() - cleared < 60


def test_a_sticky_device_error_ends_the_process_non_zero(faulty):
    (faulty.flags / "forward").write_text(
        "CUDA error: an illegal memory access was encountered"
    )
    reply = embed(faulty, random_seqs(4, seed=5))
    assert reply.status_code in (424, 503), reply.text
    faulty.proc.wait(30)
    assert faulty.proc.returncode not in (0, None), faulty.log()


def test_a_failing_warm_up_stops_the_server_before_ready(tmp_path):
    flags = tmp_path / "flags"
    flags.mkdir()
    (flags / "forward").write_text("out of memory")
    port = free_port()
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "tests.service.faulty_serve", "serve"),
            *("--port", str(port), "--store", tmp_path / "store", "--model", MODEL),
        ],
        capture_output=True,
        text=True,
        env={**cli_env(), ENV: str(flags)},
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0
    assert "warm-up" in proc.stderr + proc.stdout


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_a_slow_store_past_the_deadline_keeps_the_threads_bounded(tmp_path):
    server = start(tmp_path, "--request-timeout", "1")
    pid, peak, waving = server.proc.pid, [], threading.Event()

    def sample():  # the process's threads, every 0.1 s while the waves run
        while not waving.wait(0.1):
            peak.append(n_threads(pid))

    try:
        cached = random_seqs(4, seed=40)
        assert embed(server, cached).status_code == 200
        base = n_threads(pid)
        (server.flags / "contains-slow").write_text("10")
        sampler = threading.Thread(target=sample)
        sampler.start()
        codes = set()
        with ThreadPoolExecutor(40) as pool:
            for _ in range(3):  # waves of 40 look-ups, each past its deadline
                replies = list(pool.map(lambda _: embed(server, cached), range(40)))
                codes |= {reply.status_code for reply in replies}
        waving.set()
        sampler.join()
        assert codes <= {503, 504}, codes
        # the default limit of 32 worker threads, and a few of the loop's own
        assert max(peak) <= base + 32 + 8, (base, max(peak))  # was 9 -> 209
        (server.flags / "contains-slow").unlink()
        wait_for(
            lambda: embed(server, cached).status_code == 200,
            30,
            "not serving again once the store answered",
        )
        assert status(server, wire.ROUTE_LIVE) == 200
    finally:
        waving.set()
        server.stop()


def test_liveness_fails_while_a_pass_makes_no_progress(tmp_path):
    server = start(tmp_path, "--stall-seconds", "1")
    try:
        (server.flags / "forward-slow").write_text("5")
        asking = threading.Thread(target=embed, args=(server, random_seqs(2, seed=50)))
        asking.start()
        wait_for(
            lambda: status(server, wire.ROUTE_LIVE) == 503,
            10,
            "live while a pass was stuck past --stall-seconds",
        )
        (server.flags / "forward-slow").unlink()
        asking.join(30)
        wait_for(
            lambda: status(server, wire.ROUTE_LIVE) == 200,
            10,
            "not live again once the pass finished",
        )
    finally:
        server.stop()
