"""A server's cached one-sequence p99 while the same server commits a stream of misses.

Issue 28's server figure, through HTTP: ``embedcache serve --model kmer-1`` on a store
holding 10,000 sequences; one client (this process, one keep-alive connection) asks
for one cached sequence a request, NPY back, a millisecond apart. Its p99:

- idle: nothing else running;
- busy: another process streams a job of 100,000 new 32 bp sequences to the same
  server in requests of 2,000 (one at a time), which the server computes (a floor
  model: nearly free) and commits through ``put``, its auto-merge on;
- floor: the same stream sent to a second server on a store of its own, so the
  measured server shares nothing with the work but the machine (its cores, disk and
  kernel): what this machine alone does to the figure.

Sittings alternate busy and floor; each prints idle and loaded p99 and their ratio
(target: busy within 2x idle). The stream runs in its own process so that the
client's process does not wait on the stream's client for the GIL.

Run: ``.venv/bin/python benchmarks/serve_commit_bench.py [--sittings 3]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.peaks import cpu_kind_line
from benchmarks.scale_bench import started_child
from benchmarks.serve_bench import Server, load, percentile
from embedcache.engine.local import embed_sequences
from embedcache.models import load_adapter
from embedcache.service import wire
from embedcache.store import EmbeddingStore

if TYPE_CHECKING:
    from collections.abc import Callable

REPO = Path(__file__).resolve().parents[1]
MODEL = "kmer-1"
N_STORED = 10_000
N_JOB, BATCH = 100_000, 2_000
SEQ_BP = 32

# the stream: N_JOB new sequences (argv seed), BATCH a request, one at a time
STREAM = r"""
import sys
import httpx
sys.path.insert(0, sys.argv[1])
from benchmarks.serve_commit_bench import MODEL, random_seqs
url, seed, n, batch = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
seqs = random_seqs(n, seed)
with httpx.Client(base_url=url, timeout=600) as http:
    print("ready", flush=True)
    sys.stdin.readline()
    for lo in range(0, n, batch):
        body = {"model": MODEL, "sequences": seqs[lo : lo + batch]}
        http.post("/v1/embed", json=body, headers={"Accept": "application/x-npy"}).raise_for_status()
"""


def random_seqs(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    bases = np.frombuffer(b"ACGT", np.uint8)[rng.integers(0, 4, size=(n, SEQ_BP))]
    return [row.tobytes().decode() for row in bases]


def one_seq_latencies(
    http: httpx.Client, seq: str, running: Callable[[], bool]
) -> list[float]:
    """Seconds of each cached one-sequence request while ``running()`` is true."""
    out = []
    body = {"model": MODEL, "sequences": [seq]}
    while running():
        t0 = time.perf_counter()
        r = http.post(wire.ROUTE_EMBED, json=body, headers={"Accept": wire.MEDIA_NPY})
        out.append(time.perf_counter() - t0)
        r.raise_for_status()
        time.sleep(0.001)  # a request rate, not a spin
    return out


def sitting(
    measured: Server, target: Server, seq: str, seed: int
) -> tuple[float, float]:
    """(idle p99, loaded p99) in ms of ``measured`` while ``target`` takes the job."""
    with httpx.Client(base_url=measured.url, timeout=600) as http:
        one_seq_latencies(http, seq, iter([True] * 50 + [False]).__next__)  # warm
        left = iter([True] * 2_000 + [False])
        idle = one_seq_latencies(http, seq, left.__next__)
        stream = started_child(
            [
                *(sys.executable, "-c", STREAM, str(REPO), target.url),
                *(str(seed), str(N_JOB), str(BATCH)),
            ]
        )
        t0 = time.perf_counter()
        busy = one_seq_latencies(http, seq, lambda: stream.poll() is None)
        if stream.wait():
            sys.exit(f"the stream failed ({stream.returncode})")
        job_s = time.perf_counter() - t0
    p_idle, p_busy = 1e3 * percentile(idle, 99), 1e3 * percentile(busy, 99)
    where = "the same server" if measured is target else "another server (floor)"
    print(
        f"  job to {where}: idle p99 {p_idle:.2f} ms (p50 "
        f"{1e3 * percentile(idle, 50):.2f}, n={len(idle)}); during the job "
        f"({job_s:.1f} s) p99 {p_busy:.2f} ms (p50 {1e3 * percentile(busy, 50):.2f}, "
        f"n={len(busy)}): {p_busy / p_idle:.2f}x",
        flush=True,
    )
    return p_idle, p_busy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sittings", type=int, default=3)
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores, {cpu_kind_line()}; load {load()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        seqs = random_seqs(N_STORED, 0)
        embed_sequences(load_adapter(MODEL), seqs, EmbeddingStore(work / "a"))
        servers = [
            Server(work / name, MODEL, work / f"{name}.log") for name in ("a", "b")
        ]
        try:
            ratios: dict[str, list[float]] = {"busy": [], "floor": []}
            for i in range(args.sittings):
                print(f"sitting {i + 1} (load {load()}):", flush=True)
                for kind, target in (("busy", servers[0]), ("floor", servers[1])):
                    seed = 1 + 2 * i + (kind == "floor")  # new sequences each job
                    idle, loaded = sitting(servers[0], target, seqs[i], seed)
                    ratios[kind].append(loaded / idle)
        finally:
            for server in servers:
                server.stop()
    print(
        "p99 during the job over idle: same server "
        + ", ".join(f"{x:.2f}x" for x in ratios["busy"])
        + " (target <= 2x); floor "
        + ", ".join(f"{x:.2f}x" for x in ratios["floor"]),
        flush=True,
    )


if __name__ == "__main__":
    main()
