"""Embedding on Dask: throughput, per-unit overhead, many writers, a projection.

(a) The same job in-process and on ``local:2`` (two worker processes, cores/2 threads
    each): tokens/s and their ratio. The model is embed_bench's NT-v2-50M-shaped
    encoder in fp32; each side runs once to warm up (model load, first allocations)
    and is then timed on a fresh store; the vectors are compared bit for bit.
(b) Engine overhead per unit: the Dask round trip of empty units, the store lookup of
    a unit and the commit of its vectors, against the compute of a unit of the size
    the engine picks for the worker's rate measured in (a) (``next_unit_tokens``), and
    of a GPU-sized unit for (d).
(c) Many writers: ``--writers`` processes commit ``--commits`` small units in all
    (about 41k vectors, dim 512) into one store, without and with each writer's
    auto-merge; then opening the key and looking up the 41k hashes, before and after
    ``compact``.
(d) A projection for 10, 25 and 100 GPU workers on atlas-full-v1 x 10 models from
    (b) and (c) and a stated GPU throughput and model load time (no GPU here).

Run: ``.venv/bin/python benchmarks/dask_bench.py [--n 240] [--commits 2000]``. The
machine is shared: the load average is printed with each part.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.shapes import build_model, load_sequences
from embedcache.engine.cluster import embed_on_cluster, run_units
from embedcache.engine.dask_setup import open_cluster
from embedcache.engine.local import embed_sequences
from embedcache.engine.plan import WorkUnit
from embedcache.engine.unit_queue import (
    MIN_UNIT_TOKENS,
    TARGET_UNIT_SECONDS,
    next_unit_tokens,
)
from embedcache.engine.worker import resolve_spec, store_ref
from embedcache.models import load_adapter
from embedcache.specs import ModelKey
from embedcache.store import AUTO_MERGE, EmbeddingStore

DIM = 512
KEY = ModelKey(
    model_id="bench/writers", revision="0" * 40, adapter="bench", adapter_version="1"
)
# atlas-full-v1: every published test sequence and 500 train per dataset
ATLAS = {  # dataset: (sequences, bp)
    "human_enhancers_cohn": (6_948 + 500, 500),
    "human_nontata_promoters": (9_034 + 500, 251),
    "demo_coding_vs_intergenomic_seqs": (25_000 + 500, 200),
}


def load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def hashes_of(n: int, salt: str = "") -> list[str]:
    return [hashlib.sha256(f"{salt}seq-{i}".encode()).hexdigest() for i in range(n)]


# --- (a) ----------------------------------------------------------------------------


def part_a(work: Path, n: int, gpu_rows: int) -> dict[str, float]:
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the random model's load report is expected
    hf_logging.disable_progress_bar()
    model = work / "nt50m-like"
    build_model(model)
    seqs, what = load_sequences(n)
    adapter = load_adapter(str(model), device="cpu")
    tokens = sum(adapter.n_tokens_many(seqs))
    print(f"\n(a) in-process vs local:2 (load average {load()})")
    print(f"  {what}; {tokens} model tokens; fp32, NT-v2-50M-shaped encoder")

    embed_sequences(adapter, seqs[:16], EmbeddingStore(work / "warm-in"))
    start = time.perf_counter()
    alone = embed_sequences(adapter, seqs, EmbeddingStore(work / "in-process"))
    t_in = time.perf_counter() - start
    print(
        f"  in-process ({torch.get_num_threads()} torch threads): {t_in:7.2f} s "
        f"{tokens / t_in:8.0f} tok/s"
    )

    start = time.perf_counter()
    with open_cluster("local:2") as client:
        t_up = time.perf_counter() - start
        threads = sum(client.nthreads().values())
        # warm-up: each worker loads the model once (a unit per worker)
        embed_on_cluster(
            client,
            str(model),
            seqs[:16],
            work / "warm-cluster",
            unit_tokens=1,
            token_budget=100,
        )
        start = time.perf_counter()
        spread = embed_on_cluster(client, str(model), seqs, work / "cluster")
        t_cl = time.perf_counter() - start
        overhead = part_b(
            client,
            work,
            tokens / t_cl / len(client.nthreads()),
            tokens / len(seqs),
            gpu_rows,
        )
    same = np.array_equal(alone.vectors, spread.vectors)
    ratio = (tokens / t_cl) / (tokens / t_in)
    print(
        f"  local:2 (2 workers, {threads} threads): {t_cl:7.2f} s {tokens / t_cl:8.0f} tok/s"
        f" (+{t_up:.1f} s to start the cluster, once per command)"
    )
    print(f"  ratio local:2 / in-process: {ratio:.2f}; vectors bit-identical: {same}")
    return {"tps_in": tokens / t_in, "tps_cluster": tokens / t_cl, **overhead}


# --- (b) ----------------------------------------------------------------------------


def part_b(
    client: object, work: Path, worker_tps: float, mean_tokens: float, gpu_rows: int
) -> dict[str, float]:
    print(f"\n(b) engine overhead per unit (load average {load()})")
    spec = resolve_spec("kmer-1")
    ref = store_ref(EmbeddingStore(work / "empty"))
    keys = (spec.load().key,)
    n_workers = len(client.nthreads())
    rounds = []
    for _ in range(3):
        units = [WorkUnit(i, (), (), (), ()) for i in range(200)]
        start = time.perf_counter()
        run_units(client, spec, ref, keys, units)
        rounds.append((time.perf_counter() - start) * n_workers / len(units))
    task_s = min(rounds)
    print(
        f"  Dask round trip of an empty unit: {task_s * 1e3:6.1f} ms per unit per worker "
        f"(best of 3 x 200 units on {n_workers} workers)"
    )

    # what a unit adds in the store: a lookup and one commit of its vectors
    def store_cost(rows: int, name: str) -> tuple[float, float]:
        store = EmbeddingStore(work / name)
        rng = np.random.default_rng(0)
        lookups, commits = [], []
        for i in range(20):
            hashes = hashes_of(rows, f"{i}-")
            vectors = rng.standard_normal((rows, DIM)).astype(np.float32)
            start = time.perf_counter()
            store.contains(KEY, hashes)
            lookups.append(time.perf_counter() - start)
            start = time.perf_counter()
            store.put(KEY, hashes, vectors)
            commits.append(time.perf_counter() - start)
        return statistics.median(lookups), statistics.median(commits)

    unit = next_unit_tokens(worker_tps, 10**12, n_workers)
    rows = max(1, int(unit // mean_tokens))
    lookup_s, commit_s = store_cost(rows, "commits")
    compute_s = unit / worker_tps
    total = task_s + lookup_s + commit_s
    print(
        f"  store lookup {lookup_s * 1e3:.1f} ms + commit {commit_s * 1e3:.1f} ms of a "
        f"{rows} x {DIM} unit (median of 20, auto-merges included)"
    )
    print(
        f"  at the worker's {worker_tps:,.0f} tok/s the engine cuts units of {unit:,} "
        f"tokens = {compute_s:.1f} s of compute: overhead {total * 1e3:.0f} ms = "
        f"{100 * total / compute_s:.2f}% (goal < 5%)"
    )
    gpu_lookup_s, gpu_commit_s = store_cost(gpu_rows, "gpu-commits")
    print(
        f"  a GPU-sized unit ({gpu_rows} x {DIM}): lookup {gpu_lookup_s * 1e3:.1f} ms "
        f"+ commit {gpu_commit_s * 1e3:.1f} ms"
    )
    return {
        "task_s": task_s,
        "lookup_s": lookup_s,
        "commit_s": commit_s,
        "gpu_store_s": gpu_lookup_s + gpu_commit_s,
    }


# --- (c) ----------------------------------------------------------------------------


def writer(root: str, start: int, stop: int, rows: int, auto_merge: int) -> None:
    import logging

    # without merging, every put past 64 shards warns that compaction would help
    logging.getLogger("embedcache.store").setLevel(logging.ERROR)
    store = EmbeddingStore(root, auto_merge=auto_merge)
    rng = np.random.default_rng(start)
    for unit in range(start, stop):
        hashes = hashes_of(rows, f"u{unit}-")
        store.put(KEY, hashes, rng.standard_normal((rows, DIM)).astype(np.float32))


def open_and_lookup(root: Path, hashes: list[str]) -> float:
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        found = EmbeddingStore(root, create=False).contains(KEY, hashes)
        best = min(best, time.perf_counter() - start)
    assert found.all()
    return best


def part_c(work: Path, n_writers: int, n_commits: int, n_vectors: int) -> dict:
    rows = max(1, math.ceil(n_vectors / n_commits))
    print(
        f"\n(c) {n_writers} processes commit {n_commits} units of {rows} x {DIM} into one "
        f"store (load average {load()})"
    )
    hashes = [h for u in range(n_commits) for h in hashes_of(rows, f"u{u}-")]
    out = {}
    ctx = multiprocessing.get_context("spawn")
    for auto_merge in (0, AUTO_MERGE):
        root = work / f"writers-{auto_merge}"
        EmbeddingStore(root)
        per = math.ceil(n_commits / n_writers)
        jobs = [
            (str(root), i * per, min(n_commits, (i + 1) * per), rows, auto_merge)
            for i in range(n_writers)
        ]
        start = time.perf_counter()
        procs = [ctx.Process(target=writer, args=job) for job in jobs]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
            assert p.exitcode == 0
        t_write = time.perf_counter() - start
        store = EmbeddingStore(root)
        shards = store.keys()[0].n_shards
        t_open = open_and_lookup(root, hashes)
        start = time.perf_counter()
        store.compact()
        t_compact = time.perf_counter() - start
        t_after = open_and_lookup(root, hashes)
        faults = store.verify()
        label = "auto-merge off" if not auto_merge else f"auto-merge {auto_merge}"
        print(
            f"  {label:<14}: written in {t_write:6.1f} s ({t_write / n_commits * 1e3:.1f} ms"
            f"/commit wall); {shards} shards; open + lookup {len(hashes)} hashes "
            f"{t_open:.3f} s; compact {t_compact:.1f} s -> 1 shard: {t_after:.3f} s; "
            f"verify faults {len(faults)}"
        )
        out[auto_merge] = (shards, t_open, t_after, t_write / n_commits)
    return out


# --- (d) ----------------------------------------------------------------------------


def part_d(measured: dict, writers: dict, gpu_tps: float, load_s: float) -> None:
    n_models = 10
    seqs = sum(n for n, _ in ATLAS.values())
    tokens = sum(n * (bp + 2) for n, bp in ATLAS.values())  # a token a base + 2
    overhead = measured["task_s"] + measured["gpu_store_s"]
    print(
        f"\n(d) projection: atlas-full-v1 ({seqs:,} sequences, {tokens / 1e6:.1f}M tokens "
        f"at one token a base; 6-mer models see ~6x fewer) x {n_models} models"
    )
    print(
        f"  assumed: {gpu_tps:,.0f} tok/s a GPU (a 500M-parameter encoder in bf16 at "
        f"~40% of an A100's peak: 1 GFLOP a token) and {load_s:.0f} s to load a model "
        "on a worker from a shared cache; neither is measured here (no GPU). "
        f"Measured: {overhead * 1e3:.0f} ms of overhead a GPU-sized unit"
    )
    per_shard = writers[0][1] / max(1, writers[0][0]) if writers else math.nan
    for n_gpus in (10, 25, 100):
        # two MIN-sized units a worker while the rate is unknown, then sized by it
        first = 2 * n_gpus * MIN_UNIT_TOKENS
        unit = next_unit_tokens(gpu_tps, tokens - first, n_gpus)
        n_units = 2 * n_gpus + math.ceil(max(0, tokens - first) / unit)
        rounds = math.ceil((n_units - 2 * n_gpus) / n_gpus)
        wall = (
            load_s
            + 2 * (MIN_UNIT_TOKENS / gpu_tps + overhead)
            + rounds * (unit / gpu_tps + overhead)
        )
        share = 100 * overhead / (unit / gpu_tps)
        print(
            f"  {n_gpus:>3} GPUs: units of {unit:,} tokens (overhead {share:.1f}% of "
            f"compute), {n_units} units; {wall:5.1f} s a model, {n_models * wall / 60:4.1f} "
            f"min for {n_models} models one after another, "
            f"{n_gpus * n_models * wall / 3600:5.2f} GPU-hours "
            f"({100 * tokens / gpu_tps / (n_gpus * wall):.0f}% computing); a key of "
            f"{n_units} commits opens in ~{n_units * per_shard:.2f} s"
        )
    print(
        f"  reading: a model is ~{tokens / gpu_tps:.0f} GPU-seconds of compute, so "
        "loading the model dominates beyond ~10 GPUs; 100 GPUs pay off for ~10x more "
        "sequences or models run side by side"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=240, help="sequences for (a)")
    parser.add_argument(
        "--commits", type=int, default=2000, help="units in (c); 0 skips (c)"
    )
    parser.add_argument("--writers", type=int, default=8, help="processes in (c)")
    parser.add_argument("--vectors", type=int, default=41_000, help="vectors in (c)")
    parser.add_argument("--gpu-tps", type=float, default=125_000, help="for (d)")
    parser.add_argument("--gpu-load-s", type=float, default=30.0, help="for (d)")
    parser.add_argument("--dir", type=Path, help="where to write (default: temp)")
    args = parser.parse_args()
    import logging

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("embedcache.store").setLevel(logging.ERROR)  # see writer()
    work = Path(tempfile.mkdtemp(prefix="dask_bench_", dir=args.dir))
    print(f"cores {os.cpu_count()}, load average {load()}")
    try:
        # a GPU unit: TARGET_UNIT_SECONDS at the assumed rate, of atlas-sized items
        atlas_tokens = sum(n * (bp + 2) for n, bp in ATLAS.values())
        atlas_seqs = sum(n for n, _ in ATLAS.values())
        gpu_rows = math.ceil(
            args.gpu_tps * TARGET_UNIT_SECONDS / (atlas_tokens / atlas_seqs)
        )
        measured = part_a(work, args.n, gpu_rows)
        writers = (
            part_c(work, args.writers, args.commits, args.vectors)
            if args.commits
            else None
        )
        part_d(measured, writers, args.gpu_tps, args.gpu_load_s)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nload average at the end {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
