"""`embedcache serve` under load (locust, headless): one replica, then three, one run.

A fresh folder store is filled with ``--pool`` sequences (200-500 bp); then, for 1
and for 3 replicas of `embedcache serve` on that one store behind the round-robin
balancer of the tests (tests/service/balancer.py, in its own process, in front of
both set-ups alike), locust runs ``--users`` closed-loop users for ``--seconds``
(benchmarks/load_users.py): each request holds 1-256 sequences, 90% of requests are
hits and 10% misses. Any answer but 200, or a hit that computed, is an error.

Printed per set-up: requests/s, p50/p99 of hits and of misses, errors, and the CPU
the replicas used (utime + stime from /proc/<pid>/stat over the locust run).
CPU-normalised scaling is requests/s per busy replica core (requests/s over the
replicas' CPU-seconds per second), 3 replicas over 1: 1.0 means three replicas cost
no more CPU per request than one. torch threads per replica: the cores over the
replicas (at least 1). The model: a 256-wide 4-layer BERT, one token per base,
random weights, fp32, CPU (benchmarks/shapes.py).

Run: ``.venv/bin/python benchmarks/serve_load.py [--seconds 30] [--users 16]``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.serve_bench import free_port, load
from benchmarks.shapes import SHAPES
from embedcache.client import EmbedClient
from embedcache.service import wire

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def wait_ready(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{url} exited:\n{log.read_text()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + wire.ROUTE_READY, timeout=1).status_code == 200:
                return
        time.sleep(0.2)
    sys.exit(f"{url} not ready after 300 s")


class Replicas:
    """``n`` `embedcache serve` processes on one store behind the balancer."""

    def __init__(self, n: int, store: Path, model_dir: Path, work: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        threads = max(1, (os.cpu_count() or 1) // n)
        self.procs, urls = [], []
        for i in range(n):
            port = free_port()
            log = work / f"replica-{n}-{i}.log"
            args = [
                *(sys.executable, "-m", "embedcache.cli", "serve"),
                *("--store", str(store), "--model", f"bench={model_dir}"),
                *("--device", "cpu", "--port", str(port), "--threads", str(threads)),
            ]
            proc = subprocess.Popen(
                args, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env
            )
            self.procs.append((proc, log))
            urls.append(f"http://127.0.0.1:{port}")
        for (proc, log), url in zip(self.procs, urls, strict=True):
            wait_ready(url, proc, log)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.balancer = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.service.balancer",
                "--port",
                str(port),
                *urls,
            ],
            env=env,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(self.url + wire.ROUTE_LIVE, timeout=1)
                break
            time.sleep(0.1)

    def cpu(self) -> float:
        return sum(cpu_seconds(proc.pid) for proc, _ in self.procs)

    def stop(self) -> list[int]:
        self.balancer.terminate()
        self.balancer.wait(30)
        for proc, _ in self.procs:
            proc.terminate()
        codes = [proc.wait(120) for proc, _ in self.procs]
        for (_, log), code in zip(self.procs, codes, strict=True):
            if code != 0:  # say how, before the work folder goes
                print(f"{log.name} exited {code}; last lines:", flush=True)
                print(*log.read_text().splitlines()[-15:], sep="\n", flush=True)
        return codes


def run_locust(url: str, pool_file: Path, users: int, seconds: int, out: Path) -> dict:
    """Locust headless against ``url``; per request name its stats row."""
    env = {**os.environ, "EMBEDCACHE_LOAD_POOL": str(pool_file)}
    subprocess.run(
        [
            str(BIN / "locust"),
            *("-f", str(REPO / "benchmarks" / "load_users.py")),
            *("--headless", "-u", str(users), "-r", str(users)),
            *("-t", f"{seconds}s", "--host", url, "--csv", str(out)),
            *("--only-summary", "--loglevel", "WARNING", "--exit-code-on-error", "0"),
            # at the end, the requests in flight finish (a miss request can take
            # seconds) and are counted
            *("--stop-timeout", "120"),
        ],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=Path(f"{out}.log").open("w"),  # noqa: SIM115 (closed with the process)
    )
    with Path(f"{out}_stats.csv").open() as f:
        return {row["Name"]: row for row in csv.DictReader(f)}


def measure(
    n: int, store: Path, model_dir: Path, work: Path, args: argparse.Namespace
) -> dict:
    replicas = Replicas(n, store, model_dir, work)
    try:
        pool = (work / "pool.txt").read_text().split()
        with EmbedClient(replicas.url) as client:
            for _ in range(n):  # each replica reads the pool's shards once
                client.embed(pool, model="bench")
        cpu0, t0 = replicas.cpu(), time.perf_counter()
        stats = run_locust(
            replicas.url,
            work / "pool.txt",
            args.users,
            args.seconds,
            work / f"locust-{n}",
        )
        cpu1, t1 = replicas.cpu(), time.perf_counter()
    finally:
        codes = replicas.stop()
    total = stats["Aggregated"]
    rps = float(total["Requests/s"])
    cores = (cpu1 - cpu0) / (t1 - t0)
    return {
        "rps": rps,
        "errors": int(total["Failure Count"]),
        "requests": int(total["Request Count"]),
        "cores": cores,
        "rps_per_core": rps / cores,
        "hit": stats.get("hit", {}),
        "miss": stats.get("miss", {}),
        "codes": codes,
        "load": load(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--pool", type=int, default=256, help="hit sequences")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="serve-load-"))
    try:
        model_dir = work / "model"
        SHAPES["bert-char-256x4"].build(model_dir)
        rng = np.random.default_rng(args.seed)
        pool = [
            "".join(rng.choice(list("ACGT"), size=int(rng.integers(200, 501))))
            for _ in range(args.pool)
        ]
        (work / "pool.txt").write_text("\n".join(pool) + "\n")
        print(
            f"model: bert-char-256x4 ({SHAPES['bert-char-256x4'].about}), fp32, CPU; "
            f"{args.users} locust users, {args.seconds} s per set-up, requests of "
            f"1-{256} sequences, 90% hits (a pool of {args.pool}) / 10% misses; "
            f"load at the start {load()}",
            flush=True,
        )
        results = {}
        for n in (1, 3):
            results[n] = measure(n, work / "store", model_dir, work, args)
            print(f"{n} replica(s) done, load {results[n]['load']}", flush=True)
        print(f"\n{'replicas':>8} {'req/s':>7} {'hit p50/p99 ms':>15} {'miss p50/p99 ms':>16} "
              f"{'errors':>10} {'busy cores':>10} {'req/s/core':>10}  load")  # fmt: skip
        for n, r in results.items():
            hit, miss = r["hit"], r["miss"]
            print(
                f"{n:>8} {r['rps']:>7.1f} "
                f"{hit.get('50%', '-'):>7}/{hit.get('99%', '-'):<7} "
                f"{miss.get('50%', '-'):>8}/{miss.get('99%', '-'):<7} "
                f"{r['errors']:>4} of {r['requests']:<4} {r['cores']:>10.2f} "
                f"{r['rps_per_core']:>10.1f}  {r['load']}"
            )
        one, three = results[1], results[3]
        print(
            f"\nCPU-normalised scaling, 3 replicas over 1 (req/s per busy replica core): "
            f"{three['rps_per_core'] / one['rps_per_core']:.2f}x; raw req/s: "
            f"{three['rps'] / one['rps']:.2f}x; exit codes after SIGTERM: "
            f"{one['codes']} {three['codes']}; load at the end {load()}"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
