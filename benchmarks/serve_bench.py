"""`embedcache serve` against `embedcache embed` in one process, side by side in one run.

Issue 20's figures, fp32, ``--shape`` (a stock ESM shaped like NT-v2 50m; ``--quick``:
BERT 256 x 4): (a) no hits, 32-sequence requests against the engine in process (>=
0.9x); (b) all hits, 4 clients asking 512 a request as NPY (>= 20,000 vectors/s), one
asking one cached sequence (p99 < 20 ms); (c) eight one-sequence clients beside a
stream of 10,000-sequence requests, their p99 over a batch of the stream alone (<=
2x); (d) the server's RSS, second third of a mixed run to last (< 5%).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

from benchmarks.common import Server, bench_parser, load, machine_peaks
from benchmarks.records import Figure, record
from benchmarks.shapes import SHAPES, load_sequences, random_sequences
from embedcache.client import EmbedClient
from embedcache.engine.local import embed_sequences
from embedcache.models import load_adapter
from embedcache.models.base import Adapter
from embedcache.service import wire
from embedcache.store import EmbeddingStore

SERVE_SHAPE = "esm-6mer-512x12"
# full and --quick: (a)'s and (b)'s sequences and clients, (b)'s rounds, (c)'s seconds,
# its stream alone and mixed (in batches) and a stream request, (d)'s seconds
SIZES = {
    "n": (512, 128), "clients": (16, 4), "hit_rounds": (12, 3),
    "fair_seconds": (20.0, 5.0), "solo_batches": (3, 2), "mixed_batches": (12, 4),
    "stream_seqs": (10_000, 1_000), "memory_seconds": (30.0, 10.0),
}  # fmt: skip
# throughput, not deadlines: loaded, (a)'s clients wait over the default 300 s
SERVE_OPTIONS = ("--max-queue-tokens", str(64 * 2**20), "--max-sequences", "10000",
                 "--request-timeout", "3600")  # fmt: skip


def part_a(
    server: Server, adapter: Adapter, seqs: list[str], work: Path, clients: int
) -> dict[str, Figure]:
    tokens = sum(adapter.n_tokens(s) for s in seqs)
    t0 = time.perf_counter()
    embed_sequences(adapter, seqs, EmbeddingStore(work / "local-store"))
    local = time.perf_counter() - t0
    chunks = [seqs[i : i + 32] for i in range(0, len(seqs), 32)]

    def run(worker: int) -> None:
        with EmbedClient(server.url, concurrency=1) as client:
            for chunk in chunks[worker::clients]:
                client.embed(chunk, model="bench")

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(run, range(clients)))
    local, served = tokens / local, tokens / (time.perf_counter() - t0)
    return {
        "(a) no hits, embed in process": Figure(round(local), "tokens/s"),
        f"(a) no hits, {clients} clients x 32-seq requests": Figure(round(served), "tokens/s"),
        "(a) served / in process": Figure(round(served / local, 2), "x", ">= 0.9"),
    }  # fmt: skip


def part_b(server: Server, seqs: list[str], rounds: int) -> dict[str, Figure]:
    def run(_: int) -> int:
        with EmbedClient(server.url, max_sequences=512, concurrency=1) as client:
            return sum(len(client.embed(seqs, model="bench")) for _ in range(rounds))

    t0 = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        n = sum(pool.map(run, range(4)))
    rate = n / (time.perf_counter() - t0)
    with httpx.Client(base_url=server.url) as http:
        latencies = [one_seq(http, seqs[0]) for _ in range(520)]
    # the first 20 left out: connection set-up and first reads
    p50, p99 = 1e3 * np.percentile(latencies[20:], [50, 99])
    return {
        "(b) all hits, NPY, 4 clients": Figure(round(rate), "vectors/s", ">= 20000"),
        "(b) cached 1-seq request p50": Figure(round(p50, 1), "ms"),
        "(b) cached 1-seq request p99": Figure(round(p99, 1), "ms", "< 20"),
    }


def one_seq(http: httpx.Client, seq: str) -> float:
    """Seconds of a one-sequence request, NPY back."""
    t0 = time.perf_counter()
    body = {"model": "bench", "sequences": [seq]}
    r = http.post(wire.ROUTE_EMBED, json=body, headers={"Accept": wire.MEDIA_NPY})
    seconds = time.perf_counter() - t0
    r.raise_for_status()
    return seconds


def part_c(server: Server, args: argparse.Namespace) -> dict[str, Figure]:
    n_stream = args.stream_seqs
    stop = threading.Event()
    stream_rng = np.random.default_rng(1)

    def stream() -> None:
        # short new sequences: a request ends soon after the mixed period does
        with EmbedClient(server.url, max_sequences=n_stream, concurrency=1) as client:
            while not stop.is_set():
                sizes = stream_rng.integers(60, 120, size=n_stream)
                big = random_sequences(stream_rng, sizes)
                client.embed(big, model="bench")

    def small(worker: int) -> list[float]:
        rng = np.random.default_rng(worker)
        out = []
        with httpx.Client(base_url=server.url, timeout=120) as http:
            while not stop.is_set():
                [seq] = random_sequences(rng, [rng.integers(200, 500)])
                out.append(one_seq(http, seq))
        return out

    def forward_totals() -> tuple[float, float]:
        name = "embedcache_forward_seconds"
        return server.metric(f"{name}_sum"), server.metric(f"{name}_count")

    def mean(start: tuple[float, float], end: tuple[float, float]) -> float:
        if end[1] == start[1]:
            sys.exit("no forward batch ran in (c): the stream did not reach the server")
        return (end[0] - start[0]) / (end[1] - start[1])

    def wait_batches(start: tuple[float, float], count: int) -> tuple[float, float]:
        deadline = time.monotonic() + 600
        while (now := forward_totals())[1] - start[1] < count:
            if time.monotonic() > deadline:
                sys.exit("(c): the stream's batches did not run within 600 s")
            time.sleep(0.2)
        return now

    streamer = threading.Thread(target=stream, daemon=True)
    streamer.start()
    # the stream alone: its first batch (its request arriving mid-way) is skipped
    solo_start = wait_batches(forward_totals(), 1)
    mixed_start = wait_batches(solo_start, args.solo_batches)
    alone = mean(solo_start, mixed_start)
    # long enough for many batches: the p99 of a few would be their maximum
    seconds = max(args.fair_seconds, args.mixed_batches * alone)
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(small, w) for w in range(8)]
        time.sleep(seconds)
        stop.set()
        latencies = [x for f in futures for x in f.result()]
    mixed_end = forward_totals()
    streamer.join(timeout=600)
    p99, mixed = np.percentile(latencies, 99), mean(mixed_start, mixed_end)
    small = f"({len(latencies)} req)"
    n_alone, n_mixed = mixed_start[1] - solo_start[1], mixed_end[1] - mixed_start[1]
    return {
        f"(c) 8 one-seq clients beside a stream, p99 {small}": Figure(round(p99, 2), "s"),
        f"(c) one forward batch, stream alone ({n_alone:.0f})": Figure(round(alone, 3), "s"),
        "(c) one-seq p99 / forward batch": Figure(round(p99 / alone, 2), "x", "<= 2"),
        f"(c) mean batch while mixed ({n_mixed:.0f})": Figure(round(mixed, 3), "s"),
    }  # fmt: skip


def part_d(server: Server, seqs: list[str], seconds: float) -> dict[str, Figure]:
    rng = np.random.default_rng(0)
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(server.rss())
            time.sleep(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    deadline = time.monotonic() + seconds
    with EmbedClient(server.url) as client:
        while time.monotonic() < deadline:
            new = random_sequences(rng, [300] * 16)
            client.embed(new, model="bench")
            client.embed(seqs, model="bench")
    stop.set()
    sampler.join()
    third = len(samples) // 3
    second, last = samples[third : 2 * third], samples[2 * third :]
    growth = 100 * (statistics.median(last) / statistics.median(second) - 1)
    last_mb = statistics.median(last) / 2**20
    return {
        f"(d) server RSS, last third ({len(samples)} samples)": Figure(round(last_mb), "MB"),
        "(d) server RSS, 2nd third -> last third": Figure(round(growth, 1), "%", "< 5"),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, "fewer, shorter parts")
    parser.add_argument("--shape", default=None, choices=sorted(SHAPES))
    args = parser.parse_args(argv)
    for name, sizes in SIZES.items():
        setattr(args, name, sizes[args.quick])
    # --quick: a batch takes seconds, not minutes
    args.shape = args.shape or ("bert-char-256x4" if args.quick else SERVE_SHAPE)
    import torch

    with tempfile.TemporaryDirectory(prefix="serve-bench-") as tmp:
        work = Path(tmp)
        model_dir = work / "model"
        SHAPES[args.shape].build(model_dir)
        seqs, about = load_sequences(args.n)
        print(
            f"model: {args.shape} ({SHAPES[args.shape].about}), fp32, CPU, "
            f"torch threads {torch.get_num_threads()}; sequences: {about}"
        )
        adapter = load_adapter(str(model_dir), device="cpu")
        # first allocations
        embed_sequences(adapter, seqs[:8], EmbeddingStore(work / "warm"))
        server = Server(
            work / "store", f"bench={model_dir}", work / "server.log", SERVE_OPTIONS
        )
        try:
            print(f"(a) load {load()}", flush=True)
            figures = part_a(server, adapter, seqs, work, args.clients)
            print(f"(b) load {load()}", flush=True)
            figures |= part_b(server, seqs, args.hit_rounds)
            print(f"(c) load {load()}", flush=True)
            figures |= part_c(server, args)
            print(f"(d) load {load()}", flush=True)
            figures |= part_d(server, seqs, args.memory_seconds)
        finally:
            if server.proc.poll() is not None:  # died: say how, before the work goes
                log = (work / "server.log").read_text().splitlines()
                print("server log, last lines:", *log[-40:], sep="\n")
            code = server.stop()
        print(f"server exit code after SIGTERM: {code}; load at the end {load()}")
        record(
            "serve_bench", figures, quick=args.quick, peaks=machine_peaks(), argv=argv
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
