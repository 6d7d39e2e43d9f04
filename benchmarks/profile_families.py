"""Where a batch's time goes, per family, at each family's benchmark shape.

Per family and dtype: ``embed_sequences``'s wall time by phase (each phase's own), then
one batch under ``torch.profiler``, self CPU time per op (the top ``--top``). Records
each family's engine tokens/s and the network's share.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

START = time.perf_counter()

from benchmarks.common import (
    bench_parser,
    load,
    machine_line,
    machine_peaks,
    op_seconds,
    record_beside,
    wrapped,
)
from benchmarks.records import Figure
from benchmarks.shapes import SHAPES, adapter_options, load_sequences
from embedcache.engine import local as engine_local
from embedcache.engine.batching import batch_rule, plan_batches
from embedcache.models import load_adapter
from embedcache.store import EmbeddingStore

if TYPE_CHECKING:
    from collections.abc import Callable

    from embedcache.models.base import Adapter

IMPORTS = time.perf_counter() - START
PHASES = ("plan (validate, hash, look up)", "tokenise", "network", "store commit",
          "read back")  # fmt: skip


class Phases:
    """Wall time per phase, each phase's own: time spent in a nested phase is taken
    from the phase around it."""

    def __init__(self) -> None:
        self.own: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self._stack: list[list[Any]] = []  # [name, start, time in nested phases]

    def timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
            self._stack.append([name, time.perf_counter(), 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                _, start, nested = self._stack.pop()
                spent = time.perf_counter() - start
                self.own[name] += spent - nested
                if self._stack:
                    self._stack[-1][2] += spent

        return run


# each family at its speed benchmark's shape (benchmarks/shapes.py)
FAMILY_SHAPES = {"bert": "bert-char-512x8", "ntv2": "ntv2-50m",
                 "caduceus": "caduceus-ph", "hyena": "hyena-medium-160k"}  # fmt: skip


def phase_points(
    family: str, adapter: Adapter, store: EmbeddingStore
) -> list[tuple[object, str, str]]:
    """(object, attribute, phase): the calls that make up each phase."""
    if family == "caduceus":
        import embedcache.models.families.caduceus.adapter as module

        tokenise = [(module, "tokenize")]
        network = [(adapter.backbone, "pooled_layers"), (adapter.backbone, "pooled")]
    else:
        names = ("encode_many", "encode")
        tokenise = [
            (adapter.tokenizer, n) for n in names if hasattr(adapter.tokenizer, n)
        ]
        network = [(adapter.network, "forward")]
    return [
        (engine_local, "plan_embedding", PHASES[0]),
        *((o, n, PHASES[1]) for o, n in tokenise),
        *((o, n, PHASES[2]) for o, n in network),
        (store, "put", PHASES[3]),
        (engine_local, "collect_result", PHASES[4]),
    ]


def engine_phases(
    family: str, adapter: Adapter, seqs: list[str], tmp: Path
) -> tuple[float, dict[str, float]]:
    """Wall seconds of ``embed_sequences`` into a fresh store, and each phase's own."""
    phases = Phases()
    store = EmbeddingStore(tmp / "store")
    with ExitStack() as stack:
        for obj, name, phase in phase_points(family, adapter, store):
            wrap = lambda _, fn, p=phase: phases.timed(p, fn)
            stack.enter_context(wrapped(obj, [name], wrap))
        start = time.perf_counter()
        result = engine_local.embed_sequences(adapter, seqs, store)
        wall = time.perf_counter() - start
    if result.n_computed != len(set(seqs)):
        sys.exit(f"{family}: computed {result.n_computed} of {len(set(seqs))}")
    return wall, phases.own


def op_profile(
    adapter: Adapter, seqs: list[str]
) -> tuple[float, list[tuple[str, float]]]:
    """One batch at the adapter's token budget under torch.profiler: wall seconds,
    and (op, self CPU seconds) largest first."""
    from benchmarks.hyena_bench import KERNELS
    from embedcache.models.families.caduceus import kernels as caduceus_kernels

    longest = [s for s in seqs if len(s) == max(map(len, seqs))]
    first = plan_batches(adapter.n_tokens_many(longest), batch_rule(adapter))[0]
    batch = [longest[i] for i in first]
    adapter.embed_batch(batch)  # warm
    names = ("scan_gated", "conv_silu", "add_rms_norm")
    kernels = [(caduceus_kernels, names), *KERNELS]
    wall, ops = op_seconds(lambda: adapter.embed_batch(batch), kernels)
    return wall, list(ops.items())


def print_shares(rows: list[tuple[str, float]], total: float) -> None:
    for name, seconds in rows:
        print(f"    {name:<38} {seconds:7.3f} s  {100 * seconds / total:5.1f}%")


def report(
    family: str, dtype: str, folder: Path, args: argparse.Namespace
) -> dict[str, Figure]:
    """Both tables of one family in one dtype; its figures."""
    options = adapter_options(SHAPES[FAMILY_SHAPES[family]])
    start = time.perf_counter()
    adapter = load_adapter(str(folder), device="cpu", dtype=dtype, **options)
    adapter.embed_batch(["ACGT" * 16])  # numba kernels: compiled or loaded once
    loaded = time.perf_counter() - start
    seqs, what = load_sequences(args.n, seed=2)
    tokens = sum(adapter.n_tokens_many(seqs))
    with tempfile.TemporaryDirectory() as tmp:
        wall, own = engine_phases(family, adapter, seqs, Path(tmp))
    print(f"\n{family} {dtype}: {what}, {tokens:,} tokens; load average {load()}")
    print(f"  start-up apart: imports {IMPORTS:.2f} s, model load {loaded:.2f} s")
    print(f"  engine in process: {wall:.2f} s, {tokens / wall:,.0f} tokens/s")
    rest = ("the rest (padding, pooling, Python)", wall - sum(own.values()))
    print_shares([*own.items(), rest], wall)
    batch_wall, ops = op_profile(adapter, seqs)
    total = sum(s for _, s in ops)
    print(
        f"  one batch by op (torch.profiler, self CPU time {total:.3f} s of "
        f"{batch_wall:.3f} s wall):"
    )
    top = ops[: args.top]
    print_shares([*top, ("other ops", total - sum(s for _, s in top))], total)
    network = round(100 * own[PHASES[2]] / wall, 1)
    return {
        f"{family} {dtype} engine tokens/s": Figure(round(tokens / wall), "tokens/s"),
        f"{family} {dtype} network share": Figure(network, "%"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, "32 sequences a family")
    parser.add_argument("--families", default="bert,ntv2,caduceus,hyena")
    parser.add_argument("--dtypes", default="float32")
    parser.add_argument("--n", type=int, default=128, help="sequences per engine run")
    parser.add_argument("--top", type=int, default=12, help="ops shown per batch")
    args = parser.parse_args(argv)
    if args.quick:
        args.n = 32
    peaks = machine_peaks()
    print(machine_line(peaks))
    figures: dict[str, Figure] = {}
    with tempfile.TemporaryDirectory() as root:
        for family in args.families.split(","):
            folder = Path(root) / family
            folder.mkdir()
            SHAPES[FAMILY_SHAPES[family]].build(folder)
            for dtype in args.dtypes.split(","):
                figures |= report(family, dtype, folder, args)
    record_beside("profile_families", figures, peaks, quick=args.quick, argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
