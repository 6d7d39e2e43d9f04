"""Many short writers on one store: the run count they leave and the cold look-up.

``--writers`` separate ``embedcache embed --model kmer-1`` processes (default 120,
``--parallel`` at a time) each add ``--per-writer`` new random 32 bp sequences
(default 100) to one folder store. Prints the runs the key is left with, then the
cold look-up figure: the median wall time of 3 fresh ``embed`` runs of 100 known
sequences (all cached) against that store, beside the same against a store one
``embed`` run filled with the same sequences, and their ratio (issue 41's targets:
at most 16 runs, ratio at most 1.5).

Usage: ``python benchmarks/many_writers_bench.py [--writers N] [--per-writer N]
[--parallel N] [--workdir DIR]``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

MODEL = "kmer-1"
SEQ_BP = 32
N_KNOWN = 100
REPO = Path(__file__).resolve().parents[1]


def embed(store: Path, inputs: Path, output: Path) -> tuple[float, str]:
    """One fresh `embed` process: its wall time and its output."""
    cmd = [sys.executable, "-m", "embedcache.cli", "embed", "--model", MODEL]
    cmd += ["--store", str(store), "--input", str(inputs), "--output", str(output)]
    cmd += ["--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    return wall, done.stdout


def cold_lookup(store: Path, known: Path) -> float:
    """Median wall of 3 fresh `embed` runs of the known (all cached) sequences."""
    walls = []
    for i in range(3):
        wall, out = embed(store, known, known.with_name(f"cold{i}.npy"))
        if f"computed=0 cached={N_KNOWN}" not in out:
            raise RuntimeError(out)
        walls.append(wall)
    return float(np.median(walls))


def n_runs(store: Path) -> int:
    from embedcache.store import EmbeddingStore

    (info,) = EmbeddingStore(store, create=False).keys()
    return info.n_shards


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=120)
    parser.add_argument("--per-writer", type=int, default=100)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="many-writers-"))
    work.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(41)
    n = args.writers * args.per_writer
    seqs = ["".join(rng.choice(list("ACGT"), SEQ_BP)) for _ in range(n)]
    parts = []
    for w in range(args.writers):
        part = work / f"w{w}.txt"
        part.write_text(
            "\n".join(seqs[w * args.per_writer : (w + 1) * args.per_writer])
        )
        parts.append(part)
    many, one = work / "many", work / "one"
    start = time.perf_counter()
    with ThreadPoolExecutor(args.parallel) as pool:
        list(
            pool.map(
                lambda p: embed(many, p, p.with_suffix(".npy")),
                parts,
            )
        )
    fill = time.perf_counter() - start
    print(
        f"{args.writers} writers x {args.per_writer} sequences: {fill:.1f} s, "
        f"{n_runs(many)} runs left"
    )
    everything = work / "all.txt"
    everything.write_text("\n".join(seqs))
    embed(one, everything, work / "all.npy")
    print(f"one writer, {n} sequences: {n_runs(one)} runs")
    known = work / "known.txt"
    picks = rng.choice(n, N_KNOWN, replace=False)
    known.write_text("\n".join(seqs[i] for i in picks))
    t_many, t_one = cold_lookup(many, known), cold_lookup(one, known)
    print(f"cold {N_KNOWN}-sequence look-up, many writers: {t_many:.3f} s")
    print(f"cold {N_KNOWN}-sequence look-up, one writer:   {t_one:.3f} s")
    print(f"ratio: {t_many / t_one:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
