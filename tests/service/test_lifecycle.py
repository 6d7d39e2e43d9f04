"""SIGTERM drains with nothing lost; kill -9 mid-batch loses only uncommitted work."""

from __future__ import annotations

import signal
import threading
import time

import httpx

from embedcache.service import wire
from tests.service.conftest import Server, random_seqs, run_cli
from tests.service.poisoned_serve import TORCH_SLOW, TORCH_STARTED


def stored_count(store_path):
    from embedcache.store import EmbeddingStore

    infos = EmbeddingStore(store_path, create=False).keys()
    return sum(info.n_vectors for info in infos)


def wait_computing(server, thread):
    deadline = time.monotonic() + 60
    while server.metric("embedcache_sequences_computed_total") == 0:
        assert time.monotonic() < deadline, server.log()
        assert thread.is_alive(), server.log()
        time.sleep(0.01)


def test_sigterm_drains_and_kill_9_loses_only_uncommitted_work(tmp_path):
    store = tmp_path / "store"
    # the k-mer floor starts in seconds (no torch); the commits are what is interrupted
    base = ["--store", store, "--model", "kmer-4", "--threads", "1"]
    # one sequence a batch: many commits to interrupt
    args = [*base, "--token-budget", "64", "--graceful-timeout", "10"]
    seqs = random_seqs(400, seed=21, low=55, high=62)
    body = {"model": "kmer-4", "sequences": seqs}
    replies = {}

    def ask(server, name):
        try:
            replies[name] = httpx.post(
                f"{server.url}{wire.ROUTE_EMBED}", json=body, timeout=60
            )
        except httpx.HTTPError as err:  # the server was killed
            replies[name] = err

    # SIGTERM mid-run: the request is answered (503: queued work not computed), exit 0
    server = Server(args, log_path=tmp_path / "1.log")
    asking = threading.Thread(target=ask, args=(server, "term"))
    asking.start()
    wait_computing(server, asking)
    started = time.monotonic()
    assert server.stop(signal.SIGTERM) == 0, server.log()
    assert time.monotonic() - started < 10
    asking.join()
    assert replies["term"].status_code == 503
    assert replies["term"].json()["error"]["type"] == "unavailable"
    assert "Traceback" not in server.log()
    kept = stored_count(store)
    assert 0 < kept < len(seqs)

    # restart: what was committed is served from the store; kill -9 mid-batch
    server = Server(args, log_path=tmp_path / "2.log")
    asking = threading.Thread(target=ask, args=(server, "kill"))
    asking.start()
    wait_computing(server, asking)
    server.stop(signal.SIGKILL)
    asking.join()
    assert isinstance(replies["kill"], httpx.HTTPError)
    kept_after_kill = stored_count(store)
    assert kept_after_kill > kept

    # restart again: the same request, every committed vector from the store
    server = Server(base, log_path=tmp_path / "3.log")  # the budget is not in the key
    try:
        again = httpx.post(
            f"{server.url}{wire.ROUTE_EMBED}", json=body, timeout=120
        ).json()
    finally:
        assert server.stop() == 0
    assert again["n_cached"] == kept_after_kill
    assert again["n_computed"] == len(seqs) - kept_after_kill
    assert [item["cached"] for item in again["data"]].count(True) == kept_after_kill
    verify = run_cli("store", "verify", "--store", store)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_a_batch_outliving_the_drain_deadline_exits_0_not_abort(tmp_path):
    # a torch pass still running when the drain ends: exiting through the
    # interpreter's shutdown aborts (SIGABRT) under torch's native threads
    server = Server(
        [
            *("--store", tmp_path / "store", "--model", "kmer-4"),
            *("--graceful-timeout", "1", "--request-timeout", "60"),
        ],
        log_path=tmp_path / "serve.log",
        module="tests.service.poisoned_serve",
    )
    body = {"model": "kmer-4", "sequences": [TORCH_SLOW + "ACGT" * 10]}
    asking = threading.Thread(
        target=lambda: httpx.post(
            f"{server.url}{wire.ROUTE_EMBED}", json=body, timeout=90
        ),
        daemon=True,
    )
    asking.start()
    deadline = time.monotonic() + 60
    while TORCH_STARTED not in server.log():
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.05)
    started = time.monotonic()
    assert server.stop(signal.SIGTERM) == 0, server.log()
    assert time.monotonic() - started < 15  # the torch pass would take 30 s
    log = server.log()
    assert "still running at the drain deadline" in log
    assert "terminate called" not in log
