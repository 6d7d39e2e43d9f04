"""A writer process for the store's crash and concurrency tests (run as a script).

Puts rows ``start..stop`` (optionally reversed) of a deterministic data set in
batches, printing ``committed <n_new>`` after every put so a test knows what was
committed before it kills the process. Prints ``done <total_new>`` at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

import numpy as np

from embedcache.specs import ModelKey
from embedcache.store import EmbeddingStore, LeasePolicy, layout

KEY = ModelKey(
    model_id="test/worker", revision="0" * 40, adapter="test", adapter_version="1"
)
DIM = 16


def dataset(n: int) -> tuple[list[str], np.ndarray]:
    """Hashes and vectors of rows 0..n-1; the same in every process."""
    hashes = [hashlib.sha256(f"seq-{i}".encode()).hexdigest() for i in range(n)]
    vectors = np.random.default_rng(1234).standard_normal((n, DIM)).astype(np.float32)
    return hashes, vectors


class Clock:
    """A monotonic clock a test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def watching_collector(handle, **kwargs) -> EmbeddingStore:
    """A store that has watched ``handle``'s leftovers and leases sit unchanged for
    a whole lease and margin on its own clock: its next ``compact()`` removes every
    dead one (a collector never judges by another host's clock)."""
    clock = Clock()
    store = handle.open(lease=LeasePolicy(clock=clock), **kwargs)
    store.compact()  # the first sighting of every leftover and lease
    clock.now += layout.LEASE_S + layout.LEASE_MARGIN_S + 1
    return store


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("store", help="a folder or a URL")
    parser.add_argument("--options", default=None, help="obstore options as JSON")
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--stop", type=int, required=True)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("-r", "--reverse", action="store_true")
    parser.add_argument("--auto-merge", type=int, default=4)
    parser.add_argument("--compact", action="store_true", help="compact at the end")
    args = parser.parse_args()
    hashes, vectors = dataset(args.stop)
    rows = list(range(args.start, args.stop))
    if args.reverse:
        rows.reverse()
    options = json.loads(args.options) if args.options else None
    store = EmbeddingStore(args.store, auto_merge=args.auto_merge, options=options)
    total = 0
    for i in range(0, len(rows), args.batch):
        batch = rows[i : i + args.batch]
        n_new = store.put(KEY, [hashes[r] for r in batch], vectors[batch])
        total += n_new
        sys.stdout.write(f"committed {n_new} {batch[0]} {batch[-1]}\n")
        sys.stdout.flush()
    if args.compact:
        store.compact()
    sys.stdout.write(f"done {total}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
