"""The engine end to end, as a share of this machine's best matmul rate, per model shape.

Per shape (``--shapes``, random weights): ``embedcache embed`` afresh, start-up apart,
and a naive fp32 loop, one sequence a forward pass; FLOPs: 2 x non-embedding parameters
x tokens, plus attention's 4 x layers x hidden x t². Records each shape's best round:
share (target 65%), tokens/s, multiple of the naive loop, min cosine to it.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from benchmarks.common import (
    bench_parser,
    best_seconds,
    describe,
    embed_cli,
    faster_dtype,
    machine_line,
    machine_peaks,
    min_cosine,
    show,
)
from benchmarks.records import Figure, record
from benchmarks.shapes import SHAPES, adapter_options, load_sequences
from embedcache.engine.batching import batch_rule, plan_batches
from embedcache.models import load_adapter

if TYPE_CHECKING:
    from collections.abc import Sequence

TARGET_SHARE = ">= 65"  # issue 22: % of the machine's best matmul rate


def flops(adapter: object, counts: Sequence[int]) -> tuple[float, float]:
    """FLOPs of the model over sequences of ``counts`` tokens: (all, weights only)."""
    network = adapter.network
    tables = [m.weight for m in network.modules() if isinstance(m, torch.nn.Embedding)]
    params = sum(p.numel() for p in network.parameters()) - sum(
        t.numel() for t in tables
    )
    per_t2 = 4 * network.n_layers * adapter.dim if adapter.attention_maps else 0
    strands = 2 if adapter.rc_mode == "average" else 1  # both run
    weights = 2.0 * params * sum(counts) * strands
    return weights + per_t2 * sum(t * t for t in counts) * strands, weights


def naive_loop(adapter: object, seqs: Sequence[str]) -> tuple[np.ndarray, float]:
    """What one writes first: one sequence a forward pass, fp32."""
    start = time.perf_counter()
    vectors = np.concatenate([adapter.embed_batch([s]) for s in seqs])
    return vectors, time.perf_counter() - start


def sweep(adapter: object, seqs: Sequence[str], budgets: Sequence[int]) -> None:
    """Tokens/s of one bf16 forward at each budget, per sequence length."""
    rule = batch_rule(adapter)
    for length in sorted({len(s) for s in seqs}, reverse=True):
        same = [s for s in seqs if len(s) == length]
        if len(same) < 8:
            continue
        t = max(adapter.n_tokens_many(same[:8]))
        cells = []
        for budget in budgets:
            count = max(budget // t, 1)
            batch = list(itertools.islice(itertools.cycle(same), count))
            rate = count * t / best_seconds(lambda b=batch: adapter.embed_batch(b), 1.5)
            cells.append(f"{budget}: {rate:,.0f}")
        chosen = len(plan_batches([t] * len(same), rule)[0])
        print(
            f"    {length} bp ({t} tokens) tokens/s by budget  "
            + "  ".join(cells)
            + f"  | the rule: {rule.token_budget} tokens, {chosen} sequences a batch"
        )


def measure(
    name: str, folder: Path, seqs: list[str], args: argparse.Namespace, rnd: int
) -> tuple[float, dict[str, Figure], dict[str, float]]:
    """One round of one shape: its share (attention counted), figures and peaks."""
    shape = SHAPES[name]
    options = adapter_options(shape)
    fast = load_adapter(str(folder), device="cpu", dtype=args.dtype, **options)
    counts = fast.n_tokens_many(seqs)
    (total, weights), tokens = flops(fast, counts), sum(counts)
    with tempfile.TemporaryDirectory() as tmp:
        before = machine_peaks()
        run = embed_cli(
            folder, seqs, Path(tmp), dtype=args.dtype, options=shape.options
        )
        peaks = max(before, machine_peaks(), key=lambda p: p["best"])
    fp32 = load_adapter(str(folder), device="cpu", **options)
    naive_vectors, naive_seconds = naive_loop(fp32, seqs[: args.n_naive])
    naive_rate = sum(fp32.n_tokens_many(seqs[: args.n_naive])) / naive_seconds
    cosine = min_cosine(run.vectors[: args.n_naive], naive_vectors)
    if args.sweep:
        sweep(fast, seqs[:400], (1536, 4096, 8192, 16384, 32768))
    share, rate = total / run.wall / peaks["best"], tokens / run.wall
    show(f"  round {rnd} {name}", {
        "end to end s": run.wall, "engine s": run.engine, "start-up s": run.startup,
        "tokens/s": round(rate), "start-up excluded": round(tokens / run.engine),
        "% of the best matmul rate": 100 * share,
        "without attention": 100 * weights / run.wall / peaks["best"],
        "engine alone": 100 * total / run.engine / peaks["best"],
        "naive fp32 batch-1 tokens/s": round(naive_rate),
        "x naive": rate / naive_rate, "cosine vs naive": f"{cosine:.5f}",
    })  # fmt: skip
    print(f"    {describe(peaks)}")
    return share, {
        f"{name} share of best matmul rate": Figure(round(100 * share, 1), "%", TARGET_SHARE),
        f"{name} tokens/s end to end": Figure(round(rate), "tokens/s"),
        f"{name} vs naive fp32 batch-1": Figure(round(rate / naive_rate, 2), "x"),
        f"{name} engine vs naive min cosine": Figure(round(cosine, 5)),
    }, peaks  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, "1 round, 20k tokens")
    parser.add_argument("--shapes", default="bert-char-512x8,ntv2-50m")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=200_000, help="a run's")
    parser.add_argument("--n-naive", type=int, default=32)
    parser.add_argument(
        "--dtype", choices=("float32", "bfloat16"), default=faster_dtype()
    )
    parser.add_argument("--sweep", action="store_true", help="token budgets in process")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.tokens, args.n_naive = 1, 20_000, 8
    names = args.shapes.split(",")
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        sys.exit(f"unknown shape {unknown[0]!r}; known: {', '.join(SHAPES)}")
    print(f"{machine_line()}; engine dtype {args.dtype}")
    inputs: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="embed_bench-") as tmp:
        root = Path(tmp)
        for name in names:
            folder = root / name
            folder.mkdir()
            SHAPES[name].build(folder)
            probe = load_adapter(
                str(folder), device="cpu", **adapter_options(SHAPES[name])
            )
            sample, _ = load_sequences(200, seed=1)
            per_seq = sum(probe.n_tokens_many(sample)) / len(sample)
            inputs[name], what = load_sequences(max(int(args.tokens / per_seq), 40))
            print(
                f"{name}: {SHAPES[name].about}; {what}, {per_seq:.0f} tokens each; "
                f"batches of up to {batch_rule(probe).token_budget} tokens, "
                f"{probe.attention_maps} score maps a sequence"
            )
        best: dict[str, tuple] = {}  # shape: its best round's (share, figures, peaks)
        for rnd in range(1, args.rounds + 1):
            for name in names:
                result = measure(name, root / name, inputs[name], args, rnd)
                best[name] = max(best.get(name, result), result, key=lambda r: r[0])
        figures = {k: v for _, figs, _ in best.values() for k, v in figs.items()}
        peaks = max((p for *_, p in best.values()), key=lambda p: p["best"])
        record("embed_bench", figures, quick=args.quick, peaks=peaks, argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
