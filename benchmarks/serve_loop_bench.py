"""A cached one-sequence request while other clients pull 10,000-vector JSON answers,
per checkout, side by side in one run (issue 29, item 4: the event loop only routes).

For each ``--root`` (say a checkout of main and this one), a fresh store and
`embedcache serve --model kmer-4` (256-d vectors) from that checkout: 10,000
sequences are stored, then one client times ``--n`` requests of one cached sequence
alone, and again while ``--pullers`` (3) clients loop asking for all 10,000 as JSON
floats. Printed per checkout: p50/p99 alone and under load, their ratio, the big
answers' time, and the load average.

Run: ``.venv/bin/python benchmarks/serve_loop_bench.py --root /tmp/main-old --root .``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.serve_bench import free_port, load

ROUTE_EMBED, ROUTE_READY = "/v1/embed", "/health/ready"


def sequences(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [
        "".join(rng.choice(list("ACGT"), size=rng.integers(20, 60))) for _ in range(n)
    ]


def serve(root: Path, store: Path, log: Path) -> tuple[subprocess.Popen, str]:
    url = f"http://127.0.0.1:{free_port()}"
    env = {**os.environ, "PYTHONPATH": str(root.resolve())}
    env.pop("EMBEDCACHE_STORE", None)
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "embedcache.cli", "serve"),
            *("--store", str(store), "--model", "kmer-4", "--threads", "1"),
            *("--port", url.rsplit(":", 1)[1]),
        ],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env=env,
        cwd=root,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"server exited:\n{log.read_text()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + ROUTE_READY, timeout=1).status_code == 200:
                return proc, url
        time.sleep(0.2)
    sys.exit("server not ready after 120 s")


def timings(client: httpx.Client, body: dict, n: int) -> np.ndarray:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        reply = client.post(ROUTE_EMBED, json=body)
        out.append(time.perf_counter() - start)
        reply.raise_for_status()
    return np.asarray(out) * 1000


def measure(root: Path, n: int, n_pullers: int, tmp: Path) -> dict:
    proc, url = serve(root, tmp / "store", tmp / "server.log")
    big = {"model": "kmer-4", "sequences": sequences(10_000, seed=1)}
    one = {"model": "kmer-4", "sequences": big["sequences"][:1]}
    stop, pulls = threading.Event(), []

    def pull() -> None:
        with httpx.Client(base_url=url, timeout=600) as client:
            while not stop.is_set():
                start = time.perf_counter()
                client.post(ROUTE_EMBED, json=big).raise_for_status()
                pulls.append(time.perf_counter() - start)

    try:
        with httpx.Client(base_url=url, timeout=600) as client:
            client.post(ROUTE_EMBED, json=big).raise_for_status()
            alone = timings(client, one, n)
            pullers = [threading.Thread(target=pull) for _ in range(n_pullers)]
            for thread in pullers:
                thread.start()
            time.sleep(1.0)
            loaded = timings(client, one, n)
            stop.set()
            for thread in pullers:
                thread.join()
    finally:
        stop.set()
        proc.terminate()
        proc.wait(60)
    return {"alone": alone, "loaded": loaded, "pulls": np.asarray(pulls)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, action="append", default=[])
    parser.add_argument("--n", type=int, default=30)
    parser.add_argument("--pullers", type=int, default=3)
    args = parser.parse_args()
    roots = args.root or [Path(__file__).resolve().parents[1]]
    print(f"one cached sequence (ms) alone and beside {args.pullers} clients pulling")
    print("10,000 x 256 JSON floats; kmer-4, --threads 1")
    for root in roots:
        with tempfile.TemporaryDirectory() as tmp:
            got = measure(root, args.n, args.pullers, Path(tmp))
        a, b = got["alone"], got["loaded"]
        p50a, p99a = np.percentile(a, 50), np.percentile(a, 99)
        p50b, p99b = np.percentile(b, 50), np.percentile(b, 99)
        print(
            f"{root}: alone p50 {p50a:.1f} p99 {p99a:.1f}; loaded p50 {p50b:.1f} "
            f"p99 {p99b:.1f}; loaded/alone p50 {p50b / p50a:.1f}x; big answer "
            f"median {np.median(got['pulls']):.2f} s over {len(got['pulls'])}; "
            f"load average {load()}"
        )


if __name__ == "__main__":
    main()
