"""Peak memory of a shard merge: compact a key of R runs totalling N rows.

A store of ``--runs`` shards (kmer-1's key, dim 4, random 32-byte hashes put with
auto-merge off) is built in one subprocess; a fresh subprocess then opens it and
compacts it, and prints how far its resident set peaked (VmHWM) over where it
started, and that per merged row. Run one size at a time on a quiet machine:

    python -m benchmarks.merge_memory --rows 1000000
    python -m benchmarks.merge_memory --rows 4000000

The children import ``embedcache`` from the tree the parent imported it from
(``PYTHONPATH=<tree>`` to measure another checkout). Measured on this 2-core
machine (shared, so the seconds vary by ~2x; the memory does not), 16 runs:

    rows    before (46eff04)        streamed merge
    1 M     123.4 MiB, 129 B/row    44.0 MiB, 46 B/row
    4 M     484.1 MiB, 127 B/row    69.6 MiB, 18 B/row  (~9 B a row over 1 M)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# peak over start (MiB) of the merge before it streamed (46eff04: every key of
# the merge in memory), printed beside
BEFORE_MIB = {1_000_000: 123.4, 4_000_000: 484.1}

FILL = r"""
import sys
import numpy as np
from embedcache.models import load_adapter
from embedcache.store import EmbeddingStore
from embedcache.store.index import to_hex
n, runs, root = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
key = load_adapter("kmer-1").key
store = EmbeddingStore(root, auto_merge=0)
rng = np.random.default_rng(0)
for i in range(runs):
    k = n // runs + (i < n % runs)
    digests = np.frombuffer(rng.bytes(32 * k), "S32")
    store.put(key, to_hex(digests), rng.random((k, 4), dtype=np.float32))
print(store.keys()[0].n_shards)
"""

COMPACT = r"""
import json, sys, time
from pathlib import Path
from embedcache.engine.memory import return_freed_memory
return_freed_memory()  # as the fill does: freed temporaries go back at once
from embedcache.models import load_adapter
from embedcache.store import EmbeddingStore

def status(field):
    with Path("/proc/self/status").open() as fh:
        line = next(x for x in fh if x.startswith(field))
    return int(line.split()[1]) / 1024

key = load_adapter("kmer-1").key
store = EmbeddingStore(sys.argv[1], auto_merge=0)
try:  # the peak so far reset to the resident set now (Linux >= 4.0)
    Path("/proc/self/clear_refs").write_text("5")
except OSError:
    pass
start = status("VmHWM")
t0 = time.perf_counter()
store.compact(key)
seconds = time.perf_counter() - t0
peak = status("VmHWM")
after = store.keys()[0]
print(json.dumps({"start_mib": start, "peak_mib": peak,
                  "seconds": seconds,
                  "rows": after.n_vectors, "shards_after": after.n_shards}))
"""


def run_child(code: str, *args: str) -> str:
    import embedcache

    root = Path(embedcache.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        sys.stderr.write(done.stderr)
        msg = f"child exited {done.returncode}"
        raise RuntimeError(msg)
    return done.stdout


def measure(n_rows: int, n_runs: int, folder: Path) -> dict[str, float]:
    store = folder / f"store-{n_rows}"
    n_shards = int(run_child(FILL, str(n_rows), str(n_runs), str(store)).split()[-1])
    # not store.keys() here: it reads every key, and the merge would reuse that
    # freed memory unseen
    out = json.loads(run_child(COMPACT, str(store)).splitlines()[-1])
    out["shards"] = n_shards
    out["over_mib"] = out["peak_mib"] - out["start_mib"]
    out["bytes_per_row"] = out["over_mib"] * (1 << 20) / n_rows
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--runs", type=int, default=16)
    parser.add_argument("--dir", default=None, help="where to build the stores")
    args = parser.parse_args()
    import embedcache

    print(f"embedcache from {Path(embedcache.__file__).resolve().parent}")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for n in args.rows:
            got = measure(n, args.runs, Path(tmp))
            before = BEFORE_MIB.get(n)
            beside = (
                f"; before streaming {before:.1f} MiB "
                f"({before * (1 << 20) / n:.1f} B/row)"
                if before is not None
                else ""
            )
            print(
                f"{n:,} rows in {got['shards']} runs -> {got['rows']:,} rows in "
                f"{got['shards_after']} shard: merge peak {got['over_mib']:.1f} MiB "
                f"over its start ({got['start_mib']:.1f} MiB), "
                f"{got['bytes_per_row']:.1f} B/row, {got['seconds']:.1f} s{beside}"
            )


if __name__ == "__main__":
    main()
