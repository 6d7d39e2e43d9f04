"""Kernel candidates side by side: times, the tuner's choice, and the end-to-end figure.

``--family caduceus`` (default): the selective-scan kernels (``loop``, the numba
loop of main; ``blocked`` and ``blocked-avx512``, the state in vector registers) at
Caduceus-ph's shape (d_inner 512, d_state 16, dt_rank 16, two directions), float32
and bfloat16 I/O: state updates a second per candidate, by wall time and by this
process's CPU time (which load from other processes disturbs less), the ratio to
``loop``, and the largest difference to ``loop``'s output (0 means the same bits).
``--family encoder``: attention, ``flash`` (SDPA) against ``math`` (two matmuls, fp32
softmax) at the 512-wide BERT's shape (8 heads of 64) for a few lengths.

Then what the tuner (``embedcache.models.shared.tuning``) chooses here, timed afresh
(not read from the cache), and with ``--end-to-end`` the family's end-to-end
benchmark (``caduceus_bench``, ``embed_bench``), which prints the adapter beside the
naive batch-1 loop. Rounds interleave the candidates so load hits them alike.

Usage: ``python -m benchmarks.kernels_bench [--family caduceus|encoder]
[--n-seqs 8] [--length 500] [--rounds 5] [--threads 1] [--end-to-end]``
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from benchmarks.peaks import cpu_kind_line
from embedcache.models.families.caduceus import scan_blocked
from embedcache.models.shared import attention
from embedcache.models.shared.cpu_features import cpu_kind
from embedcache.models.shared.tuning import Tuner, fingerprint

if TYPE_CHECKING:
    from collections.abc import Callable

END_TO_END = {
    "caduceus": ["-m", "benchmarks.caduceus_bench", "--n-seqs", "16", "--rounds", "2"],
    "encoder": ["-m", "benchmarks.embed_bench"],
}
SCAN_SHAPE = {"d_inner": 512, "d_state": 16, "dt_rank": 16}


def _as_float(out: np.ndarray, *, bf16: bool) -> np.ndarray:
    if bf16:
        return (out.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return out.copy()


def time_side_by_side(
    runs: dict[str, Callable[[], Any]], *, rounds: int
) -> dict[str, tuple[float, float]]:
    """Best (wall, CPU) seconds per candidate over ``rounds`` interleaved rounds."""
    best = {name: (float("inf"), float("inf")) for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            c0, t0 = time.process_time(), time.perf_counter()
            run()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
    return best


def bench_scan(args: argparse.Namespace) -> None:
    kernels = scan_blocked.candidates(
        d_state=SCAN_SHAPE["d_state"], d_inner=SCAN_SHAPE["d_inner"]
    )
    n_updates = 2 * args.n_seqs * args.length * SCAN_SHAPE["d_inner"] * 16
    print(
        f"scan: {args.n_seqs} sequences x {args.length} tokens x 2 directions, "
        f"d_inner {SCAN_SHAPE['d_inner']}, d_state 16: {n_updates / 1e6:.1f} M state "
        f"updates a call; {args.threads} numba thread(s)"
    )
    for bf16 in (False, True):
        inputs = scan_blocked.synthetic_inputs(
            n_seq=args.n_seqs, length=args.length, bf16=bf16, **SCAN_SHAPE
        )
        outs = {}
        for name, kernel in kernels.items():  # compile (or load) and check first
            kernel(*inputs)
            outs[name] = _as_float(inputs[-1], bf16=bf16)
        best = time_side_by_side(
            {name: (lambda k=k, a=inputs: k(*a)) for name, k in kernels.items()},
            rounds=args.rounds,
        )
        wall0, cpu0 = best["loop"]
        print(f"  {'bfloat16' if bf16 else 'float32'} I/O:")
        for name, (wall, cpu) in best.items():
            diff = float(np.abs(outs[name] - outs["loop"]).max())
            print(
                f"    {name:<15} wall {wall * 1e3:8.1f} ms {n_updates / wall / 1e9:6.2f} G/s "
                f"x{wall0 / wall:5.2f} | cpu {cpu * 1e3:8.1f} ms "
                f"{n_updates / cpu / 1e9:6.2f} G/s x{cpu0 / cpu:5.2f} | max diff vs loop {diff:.1e}"
            )
        tuner = Tuner(None, fingerprint=fingerprint(cpu_kind()))
        chosen = scan_blocked.choose_kernel(bf16=bf16, tuner=tuner, **SCAN_SHAPE)
        print(f"    tuner: {tuner.describe()[0]} -> {chosen.__name__}")


def bench_attention(args: argparse.Namespace) -> None:
    print(f"attention: 8 heads of 64, batch {args.n_seqs}")
    for dtype in (torch.float32, torch.bfloat16):
        for length in (128, 512):
            q, k, v, keys = attention.synthetic_inputs(
                n_heads=8, length=length, head_dim=64, dtype=dtype, device="cpu"
            )
            q, k, v = (x.repeat(max(1, args.n_seqs // 4), 1, 1, 1) for x in (q, k, v))
            keys = keys.repeat(max(1, args.n_seqs // 4), 1, 1, 1)
            runs = {
                name: (lambda fn=fn, a=(q, k, v, keys): fn(*a))
                for name, fn in attention.CANDIDATES.items()
            }
            best = time_side_by_side(runs, rounds=args.rounds)
            tuner = Tuner(None, fingerprint=fingerprint(cpu_kind()))
            name = attention.choose(
                tuner=tuner,
                n_heads=8,
                length=length,
                head_dim=64,
                dtype=dtype,
                device="cpu",
            )
            cells = ", ".join(
                f"{n} {w * 1e3:.1f} ms wall / {c * 1e3:.1f} ms cpu"
                for n, (w, c) in best.items()
            )
            print(
                f"  {str(dtype)[6:]:<9} length {length:>4}: {cells}; tuner chooses {name}"
            )


def bench_caduceus_adapter(args: argparse.Namespace) -> None:
    """Caduceus-ph end to end in process: main's scan (forced ``scan=loop``) against
    the tuned one, interleaved rounds, each dtype; vectors must be equal."""
    import os
    import tempfile
    from pathlib import Path

    from benchmarks.caduceus_bench import make_checkpoint
    from embedcache.models.families.caduceus.adapter import load_caduceus_adapter
    from embedcache.models.shared.tuning import ENV_VAR

    bases = np.array(list("ACGT"))
    draws = np.random.default_rng(0).integers(0, 4, size=(args.n_seqs, args.length))
    seqs = ["".join(bases[row]) for row in draws]
    path = make_checkpoint(Path(tempfile.mkdtemp(prefix="kernels-bench-")) / "ph")
    print(
        f"Caduceus-ph (d_model 256, 16 layers), {args.n_seqs} x {args.length} bp, rc average"
    )
    for dtype in ("float32", "bfloat16"):
        adapters = {}
        for label, tune in (("main's scan (scan=loop)", "scan=loop"), ("tuned", "")):
            os.environ[ENV_VAR] = tune
            adapters[label] = load_caduceus_adapter(
                path, rc_mode="average", dtype=dtype
            )
            adapters[label].embed_batch(seqs[:2])  # compile or load the kernels
        os.environ.pop(ENV_VAR, None)
        vectors = {label: a.embed_batch(seqs) for label, a in adapters.items()}
        best = time_side_by_side(
            {label: (lambda a=a: a.embed_batch(seqs)) for label, a in adapters.items()},
            rounds=args.rounds,
        )
        (w0, c0), n_tokens = next(iter(best.values())), args.n_seqs * args.length
        same = np.array_equal(*vectors.values())
        for label, (wall, cpu) in best.items():
            print(
                f"  {dtype:<9} {label:<24} wall {n_tokens / wall:8.0f} tokens/s x{w0 / wall:5.2f} "
                f"| cpu {n_tokens / cpu:8.0f} tokens/s x{c0 / cpu:5.2f}"
            )
        print(f"  {dtype:<9} vectors equal bit for bit: {same}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=["caduceus", "encoder"], default="caduceus")
    parser.add_argument("--n-seqs", type=int, default=8)
    parser.add_argument("--length", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--end-to-end", action="store_true")
    parser.add_argument(
        "--adapter",
        action="store_true",
        help="caduceus: the adapter in process, main's scan beside the tuned one",
    )
    args = parser.parse_args(argv)
    import numba

    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    torch.set_num_threads(args.threads)
    print(f"{cpu_kind_line()}; torch {torch.__version__}, numba {numba.__version__}")
    if args.family == "caduceus" and args.adapter:
        bench_caduceus_adapter(args)
    elif args.family == "caduceus":
        bench_scan(args)
    else:
        bench_attention(args)
    if args.end_to_end:
        print(f"end to end: python {' '.join(END_TO_END[args.family])}", flush=True)
        subprocess.run([sys.executable, *END_TO_END[args.family]], check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
