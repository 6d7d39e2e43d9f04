"""Kernel candidates side by side: times, the tuner's choice, and the end-to-end figure.

``--family caduceus`` (default): the selective-scan kernels (``loop``, the numba
loop; ``blocked(-avx512)``, the state in vector registers, the loop's bits;
``fused(-avx512)``, everything in the vector code, cheaper exps; compile for AVX2 on
an AVX-512 CPU with ``NUMBA_CPU_NAME=haswell`` and a fresh ``NUMBA_CACHE_DIR``) at
Caduceus-ph's shape (d_inner 512, d_state 16, dt_rank 16, two directions), float32
and bfloat16 I/O: state updates a second per candidate, by wall time and by this
process's CPU time (which load from other processes disturbs less), the ratio to
``loop`` (issue 43's target for the best: 2x on an AVX2 CPU, 3x on AVX-512), and the
largest difference to ``loop``'s output (0 means the same bits). ``--adapter``:
Caduceus-ph in process, main's scan (``scan=loop``) beside the tuned one
(vectors within the tuner's tolerance).
``--family encoder``: attention, ``flash`` (SDPA) against ``math`` (two matmuls, fp32
softmax) at the 512-wide BERT's shape (8 heads of 64) for a few lengths; with
``--adapter``, BERT 512x8 in process, main's kernels (``attention=flash,linear=aten``)
beside the tuned ones.

Then what the tuner (``embedcache.models.shared.tuning``) chooses here, timed afresh
(not read from the cache), and with ``--end-to-end`` the family's end-to-end
benchmark (``caduceus_bench``, ``embed_bench``), which records its own figures.
Rounds interleave the candidates so load hits them alike.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from benchmarks.common import (
    bench_parser,
    machine_line,
    machine_peaks,
    record_beside,
    set_threads,
)
from benchmarks.records import Figure
from benchmarks.shapes import build_bert_char, build_caduceus_ph, random_sequences
from embedcache.models.families.caduceus import scan_blocked
from embedcache.models.shared import attention
from embedcache.models.shared.cpu_features import cpu_kind
from embedcache.models.shared.tuning import TOLERANCE, Tuner, fingerprint

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

END_TO_END = {"caduceus": "caduceus_bench", "encoder": "embed_bench"}
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


def tuner() -> Tuner:
    """A tuner that times afresh: no cache read or written."""
    return Tuner(None, fingerprint=fingerprint(cpu_kind()))


def bench_scan(args: argparse.Namespace) -> dict[str, Figure]:
    kernels = scan_blocked.candidates(
        d_state=SCAN_SHAPE["d_state"], d_inner=SCAN_SHAPE["d_inner"]
    )
    n_updates = 2 * args.n_seqs * args.length * SCAN_SHAPE["d_inner"] * 16
    print(f"scan: {n_updates / 1e6:.1f} M state updates a call, {args.n_seqs} seqs")
    # issue 43: 3x where numba compiles AVX-512 code, else 2x
    target = ">= 3" if "fused-avx512" in kernels else ">= 2"
    figures = {}
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
        io = "bfloat16" if bf16 else "float32"
        wall0, cpu0 = best["loop"]
        for name, (wall, cpu) in best.items():
            rate = round(n_updates / wall / 1e9, 2)
            figures[f"scan {io} {name} state updates/s"] = Figure(rate, "G/s")
            if name != "loop":
                diff = float(np.abs(outs[name] - outs["loop"]).max())
                figures[f"scan {io} {name} vs loop, CPU time"] = Figure(
                    round(cpu0 / cpu, 2), "x"
                )
                figures[f"scan {io} {name} max diff vs loop"] = Figure(
                    float(f"{diff:.1e}")
                )
        fastest = max(wall0 / wall for wall, _ in best.values())
        figures[f"scan {io} best vs loop"] = Figure(round(fastest, 2), "x", target)
        chooser = tuner()
        chosen = scan_blocked.choose_kernel(bf16=bf16, tuner=chooser, **SCAN_SHAPE)
        print(f"  {io} I/O, tuner: {chooser.describe()[0]} -> {chosen.__name__}")
    return figures


def bench_attention(args: argparse.Namespace) -> dict[str, Figure]:
    figures = {}
    for dtype in (torch.float32, torch.bfloat16):
        for length in (128, 512):
            shape = attention.Shape(8, length, 64, dtype, "cpu")
            q, k, v, keys = attention.synthetic_inputs(shape)
            q, k, v, keys = (
                x.repeat(max(1, args.n_seqs // 4), 1, 1, 1) for x in (q, k, v, keys)
            )
            runs = {
                name: (lambda fn=fn, a=(q, k, v, keys): fn(*a))
                for name, fn in attention.CANDIDATES.items()
            }
            best = time_side_by_side(runs, rounds=args.rounds)
            name = attention.choose(tuner=tuner(), shape=shape)
            print(f"  attention {str(dtype)[6:]} length {length}: tuner chooses {name}")
            for n, (wall, cpu) in best.items():
                what = f"attention {str(dtype)[6:]} length {length} {n}"
                figures[f"{what} wall"] = Figure(round(wall * 1e3, 2), "ms")
                figures[f"{what} CPU"] = Figure(round(cpu * 1e3, 2), "ms")
    return figures


# in process, main's kernels (forced) beside the tuned ones: the model, its options,
# main's choice and whether the vectors must be equal bit for bit
ADAPTERS = {
    "caduceus": (build_caduceus_ph, {"rc_mode": "average", "random_init": 0},
                 "scan=loop", False),
    "encoder": (build_bert_char, {}, "attention=flash,linear=aten", False),
}  # fmt: skip


def bench_adapter(args: argparse.Namespace) -> dict[str, Figure]:
    """The family's model end to end in process (Caduceus-ph; BERT 512x8 for the
    encoders): main's kernels (forced) against the tuned ones, interleaved rounds,
    each dtype; the tuned vectors equal main's (Caduceus) or within tolerance."""
    from embedcache.models import load_adapter
    from embedcache.models.shared.tuning import ENV_VAR

    build, options, mains, exact = ADAPTERS[args.family]
    seqs = random_sequences(np.random.default_rng(0), [args.length] * args.n_seqs)
    path = Path(tempfile.mkdtemp(prefix="kernels-bench-"))
    build(path)
    figures = {}

    def run(adapter: Any, tune: str, batch: list[str]) -> np.ndarray:  # noqa: ANN401
        os.environ[ENV_VAR] = tune  # encoders choose at every forward pass
        try:
            return adapter.embed_batch(batch)
        finally:
            os.environ.pop(ENV_VAR, None)

    for dtype in ("float32", "bfloat16"):
        adapters = {}
        for label, tune in (("main's kernels", mains), ("tuned", "")):
            os.environ[ENV_VAR] = tune
            adapters[label] = (load_adapter(str(path), dtype=dtype, **options), tune)
            run(*adapters[label], seqs[:2])  # compile, load or tune the kernels
        main_v, tuned_v = (run(a, t, seqs) for a, t in adapters.values())
        diff = float(np.abs(tuned_v - main_v).max() / np.abs(main_v).max())
        if (exact and diff) or diff > TOLERANCE[dtype]:
            sys.exit(
                f"{dtype}: the tuned kernels' vectors differ from main's by {diff}"
            )
        figures[f"adapter {dtype} max diff vs main's"] = Figure(float(f"{diff:.1e}"))
        best = time_side_by_side(
            {label: (lambda a=a, t=t: run(a, t, seqs)) for label, (a, t) in adapters.items()},
            rounds=args.rounds,
        )  # fmt: skip
        n_tokens = args.n_seqs * args.length
        for label, (wall, _) in best.items():
            figures[f"adapter {dtype} {label} tokens/s"] = Figure(
                round(n_tokens / wall), "tokens/s"
            )
        (w0, c0), (w1, c1) = best.values()
        figures[f"adapter {dtype} tuned vs main's, wall"] = Figure(
            round(w0 / w1, 2), "x"
        )
        figures[f"adapter {dtype} tuned vs main's, CPU time"] = Figure(
            round(c0 / c1, 2), "x"
        )
        figures[f"adapter {dtype} tuned vs main's, max diff"] = Figure(
            float(f"{diff:.1e}")
        )
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, "4 sequences, 2 rounds")
    parser.add_argument("--family", choices=["caduceus", "encoder"], default="caduceus")
    parser.add_argument("--n-seqs", type=int, default=8)
    parser.add_argument("--length", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch and numba")
    parser.add_argument("--end-to-end", action="store_true")
    parser.add_argument("--adapter", action="store_true", help="the model, in process")
    args = parser.parse_args(argv)
    if args.quick:
        args.n_seqs, args.rounds = 4, 2
    set_threads(args.threads)
    peaks = machine_peaks()
    print(machine_line(peaks))
    if args.family == "encoder":
        figures = (bench_adapter if args.adapter else bench_attention)(args)
    else:
        figures = (bench_adapter if args.adapter else bench_scan)(args)
    record_beside("kernels_bench", figures, peaks, quick=args.quick, argv=argv)
    if args.end_to_end:
        end_to_end = [
            sys.executable,
            "-m",
            "benchmarks",
            "run",
            END_TO_END[args.family],
        ]
        subprocess.run([*end_to_end, *(["--quick"] if args.quick else [])], check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
