"""HyenaDNA throughput: a naive official-style loop vs the embedcache adapter and engine.

An official-shape, random-initialised HyenaDNA medium-160k (benchmarks/shapes.py) on
real 500 bp test sequences from ../shared/data when present. In
interleaved rounds (best of each kept): ``naive``, the official code one sequence at a
time in fp32 (channels-first depthwise conv, the implicit filter recomputed every
call, FFTs at 2L), and the engine (``embed_sequences``, sorted right-padded batches)
in each dtype at several token budgets. Also: where the time goes (matmuls, FFTs, numba
kernels, the rest; torch's profiler), the share of the best matmul rate, bf16 against
fp32, and ``embedcache embed`` end to end in a fresh
interpreter (after an untimed run that fills the kernel cache).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.common import (
    against_naive,
    agreement,
    bench_parser,
    both_dtypes,
    describe,
    end_to_end,
    load,
    machine_line,
    machine_peaks,
    op_categories,
    set_threads,
)
from benchmarks.records import Figure, record
from benchmarks.shapes import build_hyena_medium, load_sequences
from embedcache.engine.local import embed_sequences
from embedcache.models import load_adapter
from embedcache.models.families.hyena import kernels as hyena_kernels
from embedcache.models.families.hyena.adapter import SEP_ID, tokenize
from embedcache.store import EmbeddingStore

# test sequences of one set, or random ones of its length without the data
ENHANCERS = {"datasets": ("human_enhancers_cohn",), "lengths": (500,)}


# -- the naive, official-style loop ----------------------------------------------------


def naive_hidden(net: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The official forward for one (1, L) input, in float32, with the same weights."""
    length = ids.shape[1]
    d = net.hidden_size
    x = net.embeddings.word_embeddings(ids)
    for block in net.layers:
        m, mlp = block.mixer, block.mlp
        u = F.layer_norm(x, (d,), block.norm1.weight, block.norm1.bias, 1e-5)
        u = F.linear(u, m.in_proj.weight, m.in_proj.bias).transpose(1, 2)
        u = F.conv1d(
            u, m.short_filter.weight, m.short_filter.bias, padding=2, groups=3 * d
        )[..., :length]
        x0, x1, v = u.split(d, dim=1)
        f = m.filter_fn
        h = f.implicit_filter(f.pos_emb.z[:, :length])
        h = h * (torch.exp(-f.pos_emb.t[:, :length] * f.modulation.deltas.abs()) + 0.05)
        k = h[0].transpose(0, 1)
        v = v * x1
        n = 2 * length
        k_f = torch.fft.rfft(k, n=n) / n
        y = torch.fft.irfft(torch.fft.rfft(v, n=n) * k_f, n=n, norm="forward")
        y = (y[..., :length] + v * f.bias.unsqueeze(-1)) * x0
        y = F.linear(y.transpose(1, 2), m.out_proj.weight, m.out_proj.bias)
        residual = y + x
        h = F.layer_norm(residual, (d,), block.norm2.weight, block.norm2.bias, 1e-5)
        h = F.gelu(F.linear(h, mlp.fc1.weight, mlp.fc1.bias), approximate="tanh")
        x = F.linear(h, mlp.fc2.weight, mlp.fc2.bias) + residual
    return net.ln_f(x)


def naive_loop(net: torch.nn.Module, seqs: list[str]) -> tuple[np.ndarray, float]:
    rows = []
    start = time.perf_counter()
    with torch.inference_mode():
        for seq in seqs:
            ids = torch.from_numpy(np.append(tokenize(seq), SEP_ID))[None]
            rows.append(naive_hidden(net, ids)[0, :-1].mean(dim=0).numpy())
    return np.stack(rows), time.perf_counter() - start


def engine_run(
    adapter: object, seqs: list[str], *, budget: int
) -> tuple[np.ndarray, float]:
    start = time.perf_counter()
    result = embed_sequences(
        adapter, seqs, EmbeddingStore("memory://"), token_budget=budget
    )
    return result.vectors, time.perf_counter() - start


# -- where the time goes ---------------------------------------------------------------


KERNELS = [(hyena_kernels, ("short_conv_gate", "gate_out", "gelu_tanh", "add_norm"))]
CATEGORIES = {
    "FFTs": ("aten::_fft_r2c", "aten::_fft_c2r", "aten::_fft_c2c"),
    "numba kernels": ("numba::",),
}


def matmul_flops_per_token(config: dict) -> int:
    d, inner, n = config["d_model"], config["d_inner"], config["n_layer"]
    return 2 * n * (d * 3 * d + d * d + 2 * d * inner)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, "1 round, fewer sequences")
    parser.add_argument("--n", type=int, default=96, help="sequences for the engine")
    parser.add_argument("--n-naive", type=int, default=16, help="for the naive loop")
    parser.add_argument("--budgets", default="2048,4096,8192,16384")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtypes", default=both_dtypes(), help="the engine's")
    parser.add_argument("--threads", type=int, help="torch and numba threads")
    parser.add_argument("--end-to-end", type=int, default=256, help="0: skip it")
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.n_naive, args.rounds, args.end_to_end = 32, 4, 1, 32
        args.budgets = "4096,8192"
    set_threads(args.threads)
    print(machine_line())
    seqs, what = load_sequences(args.n, **ENHANCERS)
    tokens, naive_seqs = sum(len(s) + 1 for s in seqs), seqs[: args.n_naive]
    print(f"sequences: {what}; tokens include the trailing [SEP]")
    budgets = [int(b) for b in args.budgets.split(",")]

    work = Path(tempfile.mkdtemp(prefix="hyena-bench-"))
    folder = work / "hyenadna-medium-160k-random"
    folder.mkdir()
    build_hyena_medium(folder)
    flops = matmul_flops_per_token(json.loads((folder / "config.json").read_text()))
    adapters = {
        dtype: load_adapter(str(folder), random_init=0, device="cpu", dtype=dtype)
        for dtype in args.dtypes.split(",")
    }
    for adapter in adapters.values():
        adapter.embed_batch(seqs[:4])  # warm-up: numba's cache, first allocations
    net = next(iter(adapters.values())).network
    print(
        f"model: official-shape medium-160k, random init; "
        f"{sum(p.numel() for p in net.parameters()) / 1e6:.2f}M parameters, "
        f"{flops / 1e6:.1f} MFLOP of matmuls a token"
    )

    naive_tps, naive_vectors = 0.0, None
    best: dict[tuple[str, int], tuple[float, np.ndarray]] = {}  # (dtype, budget)
    peak = {"bfloat16": 0.0, "float32": 0.0, "best": 0.0}
    for round_ in range(1, args.rounds + 1):
        now = machine_peaks()
        peak = {k: max(v, now[k]) for k, v in peak.items()}
        print(f"round {round_} (load {load()}); so far {describe(peak)}")
        vectors, elapsed = naive_loop(net, naive_seqs)
        tps = sum(len(s) + 1 for s in naive_seqs) / elapsed
        print(f"  naive loop (batch 1, fp32, n={len(naive_seqs)}) {tps:8.0f} tok/s")
        if tps > naive_tps:
            naive_tps, naive_vectors = tps, vectors
        for dtype, adapter in adapters.items():
            for budget in budgets:
                vectors, elapsed = engine_run(adapter, seqs, budget=budget)
                tps = tokens / elapsed
                print(
                    f"  engine {dtype:<8} budget {budget:>5} {tps:8.0f} tok/s"
                    f"  {100 * tps * flops / peak['best']:5.1f}% of the best matmul rate"
                )
                if tps > best.get((dtype, budget), (0.0, None))[0]:
                    best[dtype, budget] = (tps, vectors)

    def best_budget(dtype: str) -> tuple[int, float, np.ndarray]:
        """The budget of ``dtype``'s best run, its rate and vectors."""
        budget = max(
            (b for d, b in best if d == dtype), key=lambda b: best[dtype, b][0]
        )
        return budget, *best[dtype, budget]

    figures = {"naive loop tokens/s": Figure(round(naive_tps), "tokens/s")}
    for dtype in adapters:
        budget, tps, vectors = best_budget(dtype)
        # issue 22's targets (docs/models.md): fp32 >= 6x the naive loop, >= 40%
        target = ">= 6" if dtype == "float32" else None
        figures |= against_naive(f"engine {dtype} 500 bp", tps, naive_tps, target)
        share = round(100 * tps * flops / peak["best"], 1)
        figures[f"engine {dtype} share of best rate"] = Figure(share, "%", ">= 40")
        figures[f"engine {dtype} best budget"] = Figure(budget, "tokens")
        ours = vectors[: len(naive_seqs)]
        figures |= agreement(f"engine {dtype} vs naive", ours, naive_vectors)
    if len(adapters) == 2:
        fp32, bf16 = best_budget("float32")[2], best_budget("bfloat16")[2]
        figures |= agreement("bf16 vs fp32", bf16, fp32, ">= 0.999")
    if args.end_to_end:
        many, _ = load_sequences(args.end_to_end, 2, **ENHANCERS)
        figures |= end_to_end(
            folder,
            many,
            work,
            options=("--random-init", "0"),
            tokens=sum(len(s) + 1 for s in many),
            naive_rate=naive_tps,
            adapters=adapters,
        )
    shutil.rmtree(work, ignore_errors=True)
    bound = peak["best"] / flops
    print(
        f"  bound: matmuls alone at the best matmul rate would run {bound:.0f} tok/s = "
        f"{bound / naive_tps:.1f}x the naive loop"
    )
    for dtype, adapter in adapters.items():
        budget = adapter.preferred_token_budget
        batch = seqs[: max(1, budget // 501)]
        once = partial(adapter.embed_batch, batch)
        shares = op_categories(once, CATEGORIES, KERNELS)
        total = sum(shares.values())
        parts = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in shares.items())
        print(f"  where {dtype} time goes (one batch of budget {budget}): {parts}")
    record("hyena_bench", figures, quick=args.quick, peaks=peak, argv=argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
