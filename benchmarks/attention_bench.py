"""CPU attention at 500 tokens, head dim 64: SDPA vs two batched matmuls, vs the matmul rate.

Compared in one run, in interleaved rounds (best round of each kept), in float32
and bfloat16:

- ``sdpa``: ``F.scaled_dot_product_attention`` with an additive key mask (what the
  encoder families call);
- ``2-matmul``: ``Q K^T`` and ``P V`` as two batched matmuls (``torch.matmul``, the
  path the linear layers take) with the softmax in float32 between them;
- the machine's matmul rate (``--matmul`` square, default 1024²) in each dtype, measured beside them.

Each share is against **the machine's best matmul rate** (max over the two dtypes):
on a CPU without bf16 instructions the best is float32's. To see which kernel runs,
set ``ONEDNN_VERBOSE=1`` / ``MKL_VERBOSE=1`` with ``--rounds 1``.

    python benchmarks/attention_bench.py [--batch 4] [--heads 8] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from benchmarks.turns import side_by_side

if TYPE_CHECKING:
    from collections.abc import Callable


def two_matmul(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d) + mask) V, the softmax in float32."""
    scores = torch.matmul(q, k.transpose(-1, -2)).float()
    scores.mul_(q.shape[-1] ** -0.5).add_(mask)
    return torch.matmul(torch.softmax(scores, dim=-1).to(q.dtype), v)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=500)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--matmul", type=int, default=1024, help="square matmul size for the rate"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    size = args.matmul
    b, h, n, d = args.batch, args.heads, args.tokens, args.head_dim
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
        f"load average {os.getloadavg()}; B={b} H={h} L={n} d={d}"
    )
    gen = torch.Generator().manual_seed(0)
    flops = 4 * b * h * n * n * d  # two matmuls; softmax not counted
    fns: dict[str, Callable[[], object]] = {}
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        q, k, v = (torch.randn(b, h, n, d, generator=gen).to(dtype) for _ in range(3))
        mask = torch.zeros(b, 1, 1, n)
        mask[1:, ..., n - 50 :] = float("-inf")  # some padded keys
        m1, m2 = (torch.randn(size, size, generator=gen).to(dtype) for _ in range(2))
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(dtype))
        err = (two_matmul(q, k, v, mask) - ref).abs().max().item()
        print(f"{name}: max |2-matmul - sdpa| = {err:.2e}")
        fns[f"matmul {name}"] = lambda m1=m1, m2=m2: m1 @ m2
        typed_mask = mask.to(dtype)
        fns[f"sdpa {name}"] = lambda q=q, k=k, v=v, m=typed_mask: (
            F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        )
        fns[f"2-matmul {name}"] = lambda q=q, k=k, v=v, m=mask: two_matmul(q, k, v, m)
    for fn in fns.values():  # warm-up (oneDNN/MKL set-up)
        fn()
    t = side_by_side(fns, args.rounds)
    rates = {
        key: (2 * size**3 if key.startswith("matmul") else flops) / s / 1e9
        for key, s in t.items()
    }
    peak = max(rates["matmul float32"], rates["matmul bfloat16"])
    print(f"best matmul rate {peak:.1f} GFLOP/s ({size}², max over float32/bfloat16)")
    for key, rate in rates.items():
        print(
            f"  {key:<20} {t[key] * 1e3:9.2f} ms  {rate:8.1f} GFLOP/s  {rate / peak:6.0%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
