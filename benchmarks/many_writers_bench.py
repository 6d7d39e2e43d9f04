"""Many short writers on one store: the run count they leave and the cold look-up.

``--writers`` ``embedcache embed --model kmer-1`` processes (``--parallel`` at a time)
each add ``--per-writer`` new random 32 bp sequences to one store; then 3 fresh
``embed`` runs of 100 of them against it and against a store one run filled (issue
41: at most 16 runs, look-up time at most 1.5x the one writer's).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from benchmarks.common import (
    bench_parser,
    cold_lookup,
    embed_process,
    machine_line,
    machine_peaks,
    record_beside,
)
from benchmarks.records import Figure
from benchmarks.shapes import random_sequences

MODEL = "kmer-1"
SEQ_BP = 32
N_KNOWN = 100


def n_runs(store: Path) -> int:
    from embedcache.store import EmbeddingStore

    (info,) = EmbeddingStore(store, create=False).keys()
    return info.n_runs


def fill(work: Path, args: argparse.Namespace) -> list[str]:
    """The many writers' store ``work/many`` and the one writer's ``work/one``, with
    the same sequences; those sequences."""
    k = args.per_writer
    seqs = random_sequences(np.random.default_rng(41), [SEQ_BP] * args.writers * k)
    parts = [work / f"w{w}.txt" for w in range(args.writers)]
    for w, part in enumerate(parts):
        part.write_text("\n".join(seqs[w * k : (w + 1) * k]))

    def write(part: Path) -> None:
        embed_process(MODEL, work / "many", part, part.with_suffix(".npy"))

    start = time.perf_counter()
    with ThreadPoolExecutor(args.parallel) as pool:
        list(pool.map(write, parts))
    seconds = time.perf_counter() - start
    print(f"{args.writers} writers x {args.per_writer} sequences: {seconds:.1f} s")
    everything = work / "all.txt"
    everything.write_text("\n".join(seqs))
    embed_process(MODEL, work / "one", everything, work / "all.npy")
    return seqs


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, "24 writers")
    parser.add_argument("--writers", type=int, default=120)
    parser.add_argument("--per-writer", type=int, default=100)
    parser.add_argument("--parallel", type=int, default=4)
    args = parser.parse_args(argv)
    if args.quick:
        args.writers = 24
    peaks = machine_peaks()
    print(machine_line(peaks))
    with tempfile.TemporaryDirectory(prefix="many-writers-") as tmp:
        work = Path(tmp)
        seqs = fill(work, args)
        known = work / "known.txt"
        picks = np.random.default_rng(1).choice(len(seqs), N_KNOWN, replace=False)
        known.write_text("\n".join(seqs[i] for i in picks))
        t_many, _ = cold_lookup(MODEL, str(work / "many"), known)
        t_one, _ = cold_lookup(MODEL, str(work / "one"), known)
        figures = {
            "runs left by many writers": Figure(n_runs(work / "many"), "runs", "<= 16"),
            "runs left by one writer": Figure(n_runs(work / "one"), "runs"),
            "cold look-up, many writers": Figure(round(t_many, 3), "s"),
            "cold look-up, one writer": Figure(round(t_one, 3), "s"),
            "cold look-up ratio": Figure(round(t_many / t_one, 2), "x", "<= 1.5"),
        }
    record_beside("many_writers_bench", figures, peaks, quick=args.quick, argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
