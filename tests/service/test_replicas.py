"""Three `embedcache serve` replicas on one moto bucket behind a round-robin balancer.

Concurrent clients ask overlapping sequences through the balancer; one replica is
killed with -9 mid-load and the others keep answering; every answer is the vector
`embedcache embed` computes, every served sequence is in the store afterwards and the
store verifies clean. A replica sees the others' commits once its view of the bucket
is refreshed: the checks poll rather than assume at once.
"""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from embedcache.service import wire
from embedcache.store import EmbeddingStore
from tests.service.balancer import RoundRobinProxy
from tests.service.conftest import Server, random_seqs, run_cli
from tests.store.conftest import new_bucket, s3_endpoint, s3_options

__all__ = ["s3_endpoint"]  # the session's moto server, a fixture

N_REPLICAS = 3
N_CLIENTS = 4
PER_REQUEST = 4
N_REQUESTS = 8  # per client
STEP = 6  # client c starts at sequence c * STEP: neighbours share most of theirs
# a replica's view of the bucket may lag other replicas' commits by its refresh
# period; the visibility check tolerates this many seconds of it
STALENESS_S = 20.0


@pytest.fixture
def bucket(s3_endpoint, monkeypatch):
    """A store in a fresh bucket; its credentials in the environment the servers and
    the CLI read, as a deployment gives them."""
    url = f"s3://{new_bucket(s3_endpoint)}/embeddings"
    options = s3_options(s3_endpoint)
    for name, value in options.items():
        monkeypatch.setenv(name.upper(), value)
    EmbeddingStore(url, options=options)  # made once, not raced for by the replicas
    return url, options


def ask(url, seqs, *, attempts=40):
    """POST /v1/embed, retrying what a client behind a balancer retries: a 502 (the
    replica died holding the request) and a dropped connection."""
    body = {"model": "kmer-4", "sequences": seqs}
    for attempt in range(attempts):
        try:
            reply = httpx.post(url + wire.ROUTE_EMBED, json=body, timeout=60)
        except httpx.TransportError:
            reply = None
        if reply is not None and reply.status_code != 502:
            assert reply.status_code == 200, reply.text
            return reply.json()
        time.sleep(0.05 * (attempt + 1))
    pytest.fail(f"no answer after {attempts} attempts")


def served_vectors(answer):
    return {
        item["sha256"]: np.asarray(item["embedding"], np.float32)
        for item in answer["data"]
    }


def test_replicas_on_one_bucket_survive_kill_9_and_agree_with_embed(bucket, tmp_path):
    url, options = bucket
    # the k-mer floor starts in a second (no torch): what is tested is the store's
    args = ["--store", url, "--model", "kmer-4", "--threads", "1"]
    with ThreadPoolExecutor(N_REPLICAS) as pool:  # they load their models at once
        replicas = list(
            pool.map(
                # three start at once on a busy machine
                lambda i: Server(
                    args, log_path=tmp_path / f"replica-{i}.log", ready_s=240
                ),
                range(N_REPLICAS),
            )
        )
    proxy = RoundRobinProxy([r.url for r in replicas]).start()
    try:
        pool_seqs = random_seqs(STEP * N_CLIENTS + PER_REQUEST * N_REQUESTS, seed=29)
        served = {}  # sha256 -> vector, over every answer
        seq_of = {}
        lock = threading.Lock()
        answered = []
        killed = threading.Event()

        def client(c):
            for r in range(N_REQUESTS):
                start = c * STEP + r * PER_REQUEST
                seqs = pool_seqs[start : start + PER_REQUEST]
                answer = ask(proxy.url, seqs)
                with lock:
                    answered.append(killed.is_set())
                    for seq, (digest, vector) in zip(
                        seqs, served_vectors(answer).items(), strict=True
                    ):
                        seq_of[digest] = seq
                        if digest in served:  # another replica's answer: the same
                            np.testing.assert_allclose(
                                vector, served[digest], atol=1e-5
                            )
                        served[digest] = vector

        def kill_first_mid_load():
            deadline = time.monotonic() + 60
            while proxy.counts[0] < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            replicas[0].stop(signal.SIGKILL)
            killed.set()

        killer = threading.Thread(target=kill_first_mid_load)
        killer.start()
        with ThreadPoolExecutor(N_CLIENTS) as clients:
            list(clients.map(client, range(N_CLIENTS)))
        killer.join()
        assert replicas[0].proc.returncode == -signal.SIGKILL
        # the load went on after the kill, answered by the others
        assert answered.count(True) >= N_CLIENTS
        assert len(answered) == N_CLIENTS * N_REQUESTS
        survivors = replicas[1:]

        # each survivor serves what another replica committed as a hit, within the
        # staleness: ask one sequence at a time (a stale miss computes only that one)
        late = random_seqs(24, seed=30)
        ask(survivors[0].url, late)
        for n, seq in enumerate(late):
            if ask(survivors[1].url, [seq])["n_cached"] == 1:
                break
            assert n < STALENESS_S, "replica 2 never saw replica 1's commits"
            time.sleep(1.0)
        rest = ask(survivors[1].url, late[n + 1 :])
        assert rest["n_cached"] == len(late) - n - 1
    finally:
        proxy.stop()
        for replica in replicas:
            replica.stop()
    for replica in replicas[1:]:
        assert replica.proc.returncode == 0, replica.log()
        assert "Traceback" not in replica.log()

    # every answer is the vector `embedcache embed` computes for the sequence
    digests = sorted(served)
    (tmp_path / "in.txt").write_text("\n".join(seq_of[d] for d in digests) + "\n")
    embed = run_cli(
        *("embed", "--model", "kmer-4", "--input", tmp_path / "in.txt"),
        *("--store", tmp_path / "reference", "--output", tmp_path / "ref.npy"),
        *("--device", "cpu", "--no-progress"),
    )
    assert embed.returncode == 0, embed.stderr
    answers = np.stack([served[d] for d in digests])
    np.testing.assert_allclose(answers, np.load(tmp_path / "ref.npy"), atol=1e-5)

    # nothing served was lost with the killed replica, and the bucket verifies
    verify = run_cli("store", "verify", "--store", url)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    store = EmbeddingStore(url, options=options, create=False)
    (info,) = store.keys()
    stored, found = store.get(info.key, digests)
    assert found.all()
    np.testing.assert_allclose(stored, answers, atol=1e-5)
