"""Resident memory of embedding a file of 1,000,000 short sequences with a k-mer floor.

Writes ``--n-seqs`` random sequences of 20-60 bp (one a line), then, in a fresh
process each, runs:

- ``baseline``: imports embedcache and allocates the output array alone
  (n x dim float32, written through) -- what any run must hold;
- ``embed``: ``embed_file(path, MODEL, store, output=...npy, progress=True)`` into
  a new local store: read, validate and hash, look up, compute and commit in
  batches, collect the vectors in input order, write the .npy.

Prints each run's peak resident set (ru_maxrss of the finished child), its time,
the output array's size, and the embed run's peak as a ratio to the output array
and minus the baseline. The embed run's progress bars (hash, look up, embed) go to
stderr, so the hashing and look-up phases are seen to report progress.

Usage: ``python benchmarks/memory_bench.py [--n-seqs 1000000] [--model kmer-3]``
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

CHILD = r"""
import json, sys, time
from pathlib import Path
mode, path, model, workdir = sys.argv[1:5]
t0 = time.perf_counter()
if mode == "baseline":
    import numpy as np
    import embedcache.engine.api  # noqa: F401 (the same imports as a run)
    from embedcache.models import load_adapter
    adapter = load_adapter(model)
    n = sum(1 for _ in open(path))
    out = np.ones((n, adapter.dim), np.float32)  # touched: resident
    info = {"n": n, "dim": adapter.dim}
else:
    from embedcache.engine.api import embed_file
    result = embed_file(path, model, Path(workdir) / "store",
                        output=Path(workdir) / "out.npy", progress=True)
    info = {"n": len(result.vectors), "dim": int(result.vectors.shape[1]),
            "computed": result.n_computed}
info["seconds"] = time.perf_counter() - t0
print(json.dumps(info))
"""


def run_child(mode: str, path: Path, model: str, workdir: Path) -> dict:
    """Run one mode in a fresh process; its result and peak RSS (MiB)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(path), model, str(workdir)],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if peak_kib <= before:  # RUSAGE_CHILDREN keeps the max over all children
        msg = "a later child's peak is hidden by an earlier larger one; run it first"
        raise RuntimeError(msg)
    info = json.loads(done.stdout.strip().splitlines()[-1])
    info["peak_mib"] = peak_kib / 1024
    return info


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-seqs", type=int, default=1_000_000)
    parser.add_argument("--model", default="kmer-3")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        path = workdir / "seqs.txt"
        rng = np.random.default_rng(args.seed)
        letters = np.frombuffer(b"ACGT", np.uint8)
        lengths = rng.integers(20, 61, size=args.n_seqs)
        with path.open("w") as fh:
            for length in lengths:
                fh.write(letters[rng.integers(0, 4, size=length)].tobytes().decode())
                fh.write("\n")
        size_mib = path.stat().st_size / 2**20
        # the baseline first: RUSAGE_CHILDREN reports the largest child so far
        base = run_child("baseline", path, args.model, workdir)
        run = run_child("embed", path, args.model, workdir)
    out_mib = run["n"] * run["dim"] * 4 / 2**20
    print(
        f"{args.n_seqs:,} sequences of 20-60 bp ({size_mib:.1f} MiB file), "
        f"{args.model} (dim {run['dim']}), computed {run['computed']:,}"
    )
    print(f"output array (n x dim float32):     {out_mib:8.1f} MiB")
    print(f"baseline peak RSS (imports + array): {base['peak_mib']:8.1f} MiB")
    print(
        f"embed run peak RSS:                  {run['peak_mib']:8.1f} MiB "
        f"in {run['seconds']:.1f} s"
    )
    print(f"embed peak / output array:           {run['peak_mib'] / out_mib:8.2f}")
    print(
        f"embed peak - baseline:               "
        f"{run['peak_mib'] - base['peak_mib']:8.1f} MiB "
        f"({(run['peak_mib'] - base['peak_mib']) / args.n_seqs * 2**20:.0f} B/seq)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
