"""Resident memory of embedding a file of 1,000,000 short sequences with a k-mer floor.

For each ``--n-seqs`` (default 250,000, 500,000 and 1,000,000) writes that many
random sequences of 20-60 bp (one a line), then, in a fresh process each, runs:

- ``baseline``: imports embedcache and allocates the output array alone
  (n x dim float32, written through) -- what any run must hold;
- ``embed``: ``embed_file(path, MODEL, store, output=...npy, progress=True)`` into
  a new local store: read, validate and hash, look up, compute and commit in
  batches, read the vectors back in input order, write the .npy.

Prints each run's peak resident set (the child's own ru_maxrss), its time, the
output array's size, the embed run's peak as a ratio to the output array, and the
embed peak minus the baseline (so minus the output array too), in MiB and per
sequence; then one line per n. If memory is bounded by the batch and the output,
"minus baseline" grows no faster than the output when n doubles. The embed run's
progress bars (hash, look up, embed, read back) go to stderr, so the hashing and
look-up phases are seen to report progress.

Usage: ``python benchmarks/memory_bench.py [--n-seqs 250000,500000,1000000]
[--model kmer-3]``
"""

from __future__ import annotations

import argparse
import json
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
import resource
info["peak_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # this child's
print(json.dumps(info))
"""


def run_child(mode: str, path: Path, model: str, workdir: Path) -> dict:
    """Run one mode in a fresh process; its result and peak RSS (MiB)."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(path), model, str(workdir)],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    info = json.loads(done.stdout.strip().splitlines()[-1])
    info["peak_mib"] = info["peak_kib"] / 1024
    return info


def write_seqs(path: Path, n: int, seed: int) -> None:
    """``n`` random sequences of 20-60 bp, one a line."""
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"ACGT", np.uint8)
    lengths = rng.integers(20, 61, size=n)
    with path.open("w") as fh:
        for length in lengths:
            fh.write(letters[rng.integers(0, 4, size=length)].tobytes().decode())
            fh.write("\n")


def measure(n: int, model: str, seed: int) -> dict:
    """Baseline and embed runs for ``n`` sequences; prints and returns the figures."""
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        path = workdir / "seqs.txt"
        write_seqs(path, n, seed)
        size_mib = path.stat().st_size / 2**20
        base = run_child("baseline", path, model, workdir)
        run = run_child("embed", path, model, workdir)
    out_mib = run["n"] * run["dim"] * 4 / 2**20
    extra = run["peak_mib"] - base["peak_mib"]
    print(
        f"{n:,} sequences of 20-60 bp ({size_mib:.1f} MiB file), "
        f"{model} (dim {run['dim']}), computed {run['computed']:,}"
    )
    print(f"output array (n x dim float32):     {out_mib:8.1f} MiB")
    print(f"baseline peak RSS (imports + array): {base['peak_mib']:8.1f} MiB")
    print(
        f"embed run peak RSS:                  {run['peak_mib']:8.1f} MiB "
        f"in {run['seconds']:.1f} s"
    )
    print(f"embed peak / output array:           {run['peak_mib'] / out_mib:8.2f}")
    print(
        f"embed peak - baseline:               {extra:8.1f} MiB "
        f"({extra / n * 2**20:.0f} B/seq; {extra / out_mib:.2f} x the output array)"
    )
    print(flush=True)
    return {"n": n, "out": out_mib, "base": base["peak_mib"], "peak": run["peak_mib"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-seqs", default="250000,500000,1000000")
    parser.add_argument("--model", default="kmer-3")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sizes = [int(x) for x in args.n_seqs.split(",")]
    rows = [measure(n, args.model, args.seed) for n in sizes]
    print(
        f"{'n':>10} {'output':>9} {'baseline':>9} {'embed peak':>11} "
        f"{'peak/output':>12} {'peak-baseline':>14}  (MiB)"
    )
    for r in rows:
        print(
            f"{r['n']:>10,} {r['out']:9.1f} {r['base']:9.1f} {r['peak']:11.1f} "
            f"{r['peak'] / r['out']:12.2f} {r['peak'] - r['base']:14.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
