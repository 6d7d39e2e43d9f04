"""What batch-invariant vectors cost: length buckets against padding to the batch's
longest, side by side in one run.

Since issue 43 every sequence runs padded to the bucket of its own length
(:mod:`embedcache.models.shared.padding`) and batches hold one bucket each. This
runs ``embed_sequences`` into a fresh store over the same sequences both
ways, alternating (``--rounds`` each, the best kept), for the BERT 512x8 benchmark shape and
HyenaDNA medium's shape, per dtype: the old way is the same code with the buckets
turned off (a sequence padded to its batch's longest, batches cut by budget only).
Two inputs: the real test sequences (251 and 500 bp, two lengths) and lengths drawn
uniformly from 100-500 bp, where buckets add the most padding.

Run: ``.venv/bin/python benchmarks/bucket_bench.py [--n 96] [--dtypes float32,bfloat16]
[--families bert,hyena] [--rounds 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import cpu_kind_line, describe, machine_peaks
from benchmarks.shapes import build_bert_char, load_sequences
from embedcache.engine.local import embed_sequences
from embedcache.models import load_adapter
from embedcache.store import EmbeddingStore

if TYPE_CHECKING:
    from collections.abc import Iterator

    from embedcache.models.base import Adapter


@contextmanager
def unbucketed(adapter: Adapter) -> Iterator[None]:
    """The code before issue 43: pad to the batch's longest, batches by budget only."""

    def pool_longest(seqs: list[str]) -> torch.Tensor:
        encoded = adapter._encode_many(seqs)
        return adapter._pool_padded(encoded, max(map(len, encoded)))

    adapter._pool = pool_longest
    adapter.pads_to_buckets = False
    try:
        yield
    finally:
        del adapter._pool, adapter.pads_to_buckets


def engine_seconds(adapter: Adapter, seqs: list[str]) -> float:
    """Wall seconds of ``embed_sequences`` over ``seqs`` into a fresh store."""
    with tempfile.TemporaryDirectory() as tmp:
        store = EmbeddingStore(Path(tmp) / "store")
        start = time.perf_counter()
        embed_sequences(adapter, seqs, store)
        return time.perf_counter() - start


def build(family: str, folder: Path) -> dict[str, object]:
    if family == "bert":
        build_bert_char(folder)
        return {}
    from benchmarks.hyena_bench import CONFIG

    (folder / "config.json").write_text(json.dumps(CONFIG))
    return {"random_init": 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", default="bert,hyena")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--n", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"{cpu_kind_line()}; {describe(machine_peaks())}; load average "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}",
        flush=True,
    )
    real, what = load_sequences(args.n, seed=3)
    rng = np.random.default_rng(3)
    uniform = [
        "".join(rng.choice(list("ACGT"), size=int(m)))
        for m in rng.integers(100, 501, size=args.n)
    ]
    inputs = {what: real, f"{args.n} random sequences of 100-500 bp": uniform}
    for family in args.families.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            options = build(family, Path(tmp))
            for dtype in args.dtypes.split(","):
                adapter = load_adapter(tmp, device="cpu", dtype=dtype, **options)
                adapter.embed_batch(["ACGT" * 16])  # kernels compiled or loaded
                for name, seqs in inputs.items():
                    tokens = sum(adapter.n_tokens_many(seqs))
                    times: dict[str, list[float]] = {"buckets": [], "longest": []}
                    for _ in range(args.rounds):
                        times["buckets"].append(engine_seconds(adapter, seqs))
                        with unbucketed(adapter):
                            times["longest"].append(engine_seconds(adapter, seqs))
                    best = {k: min(v) for k, v in times.items()}
                    print(
                        f"{family} {dtype}, {name} ({tokens:,} tokens): buckets "
                        f"{tokens / best['buckets']:,.0f} tokens/s, batch's longest "
                        f"{tokens / best['longest']:,.0f}; buckets cost "
                        f"{100 * (best['buckets'] / best['longest'] - 1):+.1f}% "
                        f"(best of {args.rounds}, alternating)",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
