"""What every benchmark shares: the machine (matmul peaks, CPU kind, load), timing,
and ``embedcache embed`` and ``embedcache serve`` run as a user runs them. Shares are
of the machine's best matmul rate (max over float32 and bfloat16)."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from subprocess import STDOUT
from typing import TYPE_CHECKING, Any

import numpy as np

from benchmarks.records import Figure, record
from embedcache.models.shared.cpu_features import cpu_has_bf16, cpu_kind

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
ENGINE_LOG = re.compile(r"computed (\d+) sequences \((\d+) tokens\) in ([\d.]+) s")


def best_seconds(fn: Callable[[], object], seconds: float) -> float:
    """The fastest of the calls of ``fn`` made in ``seconds`` (after an untimed one)."""
    fn()
    best, end = float("inf"), time.perf_counter() + seconds
    while True:
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
        if time.perf_counter() >= end:
            return best


def matmul_peak(dtype: object, *, size: int = 2048, seconds: float = 2.0) -> float:
    """Sustained FLOP/s of a square matmul in ``dtype`` (best of a few timed runs)."""
    import torch

    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    return 2 * size**3 / best_seconds(lambda: torch.mm(a, b), seconds)


def machine_peaks(*, seconds: float = 1.5) -> dict[str, float]:
    """FLOP/s of float32 and bfloat16 matmuls, and ``best`` (their max)."""
    import torch

    # bf16 is emulated (~50x slower) without bf16 instructions: a small size suffices
    bf16_size = 512 if cpu_has_bf16() is False else 2048
    peaks = {
        "float32": matmul_peak(torch.float32, seconds=seconds),
        "bfloat16": matmul_peak(torch.bfloat16, size=bf16_size, seconds=seconds),
    }
    peaks["best"] = max(peaks.values())
    return peaks


def faster_dtype() -> str:
    """The dtype whose matmuls run faster here, from the CPU's flags."""
    return "float32" if cpu_has_bf16() is False else "bfloat16"


def both_dtypes() -> str:
    """Both dtypes where bf16 matmuls are native, else float32 alone."""
    return "float32,bfloat16" if faster_dtype() == "bfloat16" else "float32"


def machine_line(peaks: dict[str, float] | None = None) -> str:
    """torch's version and threads, the CPU kind, the matmul peaks and the load."""
    import torch

    rates = f"; {describe(peaks)}" if peaks else ""
    return (
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; CPU kind "
        f"{cpu_kind()} (/proc/cpuinfo flags){rates}; load average {load()}"
    )


def bench_parser(doc: str, quick: str) -> argparse.ArgumentParser:
    """A benchmark's parser: its docstring's first line; ``--quick`` cuts ``quick``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=quick)
    return parser


def show(label: str, values: dict[str, object]) -> None:
    """One line: ``label``, then each value after its name (floats to 3 digits)."""
    parts = (
        f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
        for k, v in values.items()
    )
    print(f"{label}: {', '.join(parts)}", flush=True)


def describe(peaks: dict[str, float]) -> str:
    fp32, bf16, best = (peaks[k] / 1e9 for k in ("float32", "bfloat16", "best"))
    return f"matmul fp32 {fp32:.1f} GFLOP/s, bf16 {bf16:.1f} GFLOP/s (best {best:.1f})"


def record_beside(
    benchmark: str,
    figures: dict[str, Figure],
    before: dict[str, float],
    *,
    quick: bool,
    argv: list[str] | None,
) -> None:
    """Record the run with the better of ``before`` and the matmul peaks now."""
    after = machine_peaks()
    print(f"at the end: {describe(after)}; load average {load()}")
    peaks = max(before, after, key=lambda p: p["best"])
    record(benchmark, figures, quick=quick, peaks=peaks, argv=argv)


def load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def set_threads(n: int | None) -> None:
    """torch's and numba's thread pools at ``n`` (None: their defaults)."""
    if n:
        import numba
        import torch

        torch.set_num_threads(n)
        numba.set_num_threads(n)


@contextmanager
def clocks(into: dict[str, float]) -> Iterator[None]:
    """Add wall and process CPU seconds of the block to ``into``."""
    wall, cpu = time.perf_counter(), time.process_time()
    yield
    into["wall"] = into.get("wall", 0.0) + time.perf_counter() - wall
    into["cpu"] = into.get("cpu", 0.0) + time.process_time() - cpu


def against_naive(
    what: str, rate: float, naive: float, target: str | None = None
) -> dict[str, Figure]:
    """``what``'s tokens/s, and its multiple of the naive loop's against ``target``."""
    return {
        f"{what} tokens/s": Figure(round(rate), "tokens/s"),
        f"{what} vs naive": Figure(round(rate / naive, 1), "x", target),
    }


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    dots = (a * b).sum(axis=1)
    return float((dots / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


def agreement(
    what: str, a: np.ndarray, b: np.ndarray, target: str | None = None
) -> dict[str, Figure]:
    """``a`` against ``b``: largest difference, smallest cosine (against ``target``)."""
    return {
        f"{what} max abs diff": Figure(float(f"{np.abs(a - b).max():.1e}")),
        f"{what} min cosine": Figure(round(min_cosine(a, b), 7), "", target),
    }


@contextmanager
def wrapped(
    module: ModuleType,
    names: Sequence[str],
    wrap: Callable[[str, Callable[..., Any]], Callable[..., Any]],
) -> Iterator[None]:
    """``module.<name> = wrap(name, original)`` for each name, inside the block."""
    originals = {name: getattr(module, name) for name in names}
    for name, fn in originals.items():
        setattr(module, name, wrap(name, fn))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(module, name, fn)


MATMULS = ("aten::addmm", "aten::mm", "aten::bmm", "aten::matmul", "aten::linear")


def op_seconds(
    fn: Callable[[], object],
    kernels: Sequence[tuple[ModuleType, Sequence[str]]] = (),
) -> tuple[float, dict[str, float]]:
    """Wall seconds of one call of ``fn`` under torch's profiler, and the self CPU
    seconds of each op, largest first; ``kernels``: (module, names) of numba kernels
    to label ``numba::<name>``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    def labelled(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:  # noqa: ANN401
            with torch.profiler.record_function(f"numba::{name}"):
                return fn(*args)

        return run

    with contextlib.ExitStack() as stack:
        for module, names in kernels:
            stack.enter_context(wrapped(module, names, labelled))
        prof = stack.enter_context(profile(activities=[ProfilerActivity.CPU]))
        start = time.perf_counter()
        fn()
        wall = time.perf_counter() - start
    ops = [(e.key, e.self_cpu_time_total / 1e6) for e in prof.key_averages()]
    return wall, dict(sorted(((k, v) for k, v in ops if v > 0), key=lambda kv: -kv[1]))


def op_categories(
    fn: Callable[[], object],
    categories: dict[str, tuple[str, ...]] | None = None,
    kernels: Sequence[tuple[ModuleType, Sequence[str]]] = (),
) -> dict[str, float]:
    """:func:`op_seconds` summed: matmuls, ``categories`` (op prefixes), the rest."""
    _, ops = op_seconds(fn, kernels)
    categories = {"matmuls": MATMULS, **(categories or {})}
    out = dict.fromkeys([*categories, "the rest"], 0.0)
    for key, seconds in ops.items():
        hit = (c for c, prefixes in categories.items() if key.startswith(prefixes))
        out[next(hit, "the rest")] += seconds
    return out


@dataclass
class CliRun:
    """An ``embed`` run: launch-to-exit and engine seconds, and its vectors."""

    wall: float
    engine: float
    vectors: np.ndarray

    @property
    def startup(self) -> float:  # imports, model load, planning, output
        return self.wall - self.engine


def run_timed(
    cmd: Sequence[str], env: dict[str, str] | None = None
) -> tuple[float, subprocess.CompletedProcess[str]]:
    """Wall seconds and the finished process of ``cmd``; exits if it fails."""
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"{cmd[:6]} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return wall, done


def embed_process(
    model: Path | str, store: Path, inputs: Path, output: Path, *options: str
) -> tuple[float, subprocess.CompletedProcess[str]]:
    """``embedcache embed --model MODEL OPTIONS`` in a fresh interpreter, timed."""
    command = [
        sys.executable, "-m", "embedcache.cli", "embed", "--model", str(model),
        *options, "--store", str(store), "--input", str(inputs),
        "--output", str(output), "--no-progress",
    ]  # fmt: skip
    return run_timed(command, {**os.environ, "PYTHONPATH": str(REPO)})


def embed_cli(
    folder: Path | str,
    seqs: Sequence[str],
    work: Path,
    *,
    dtype: str,
    options: Sequence[str] = (),
) -> CliRun:
    """``embedcache embed --model FOLDER OPTIONS --dtype DTYPE`` over ``seqs`` on a
    fresh store under ``work``; exits the benchmark if it computes less than every
    distinct sequence."""
    work.mkdir(parents=True, exist_ok=True)
    inputs, output, store = work / "seqs.txt", work / "out.npy", work / "store"
    shutil.rmtree(store, ignore_errors=True)
    inputs.write_text("\n".join(seqs) + "\n")
    wall, done = embed_process(
        folder, store, inputs, output, *options, "--dtype", dtype
    )
    engine = ENGINE_LOG.search(done.stderr)
    if engine is None or f"computed={len(set(seqs))} " not in done.stdout:
        sys.exit(
            f"expected every sequence computed:\n{done.stdout}\n{done.stderr[-1000:]}"
        )
    return CliRun(wall, float(engine.group(3)), np.load(output))


def end_to_end(
    folder: Path,
    seqs: Sequence[str],
    work: Path,
    *,
    options: Sequence[str],
    tokens: int,
    naive_rate: float,
    adapters: dict[str, Any],  # {dtype: any family's adapter}
) -> dict[str, Figure]:
    """``embedcache embed`` over ``seqs`` in the faster dtype here, after an untimed
    two-sequence run that fills the CLI's kernel cache; its vectors checked against
    ``adapters``' (of that dtype where there is one, else float32); its figures."""
    dtype = faster_dtype()
    adapter = adapters.get(dtype, adapters["float32"])
    embed_cli(folder, seqs[:2], work / "warm", dtype=dtype, options=options)
    run = embed_cli(folder, seqs, work / "run", dtype=dtype, options=options)
    cosine = min_cosine(run.vectors[:8], adapter.embed_batch(list(seqs[:8])))
    rate, apart = tokens / run.wall, tokens / run.engine / naive_rate
    print(f"embed end to end: {apart:.1f}x naive minus start-up, cosine {cosine:.7f}")
    return {
        f"embed end to end {dtype}": Figure(round(rate), "tokens/s"),
        f"embed end to end {dtype} vs naive": Figure(round(rate / naive_rate, 1), "x"),
        "embed end to end start-up": Figure(round(run.startup, 2), "s"),
    }


# a fresh interpreter running a function of a module here: CHILD REPO MODULE NAME ARGS
CHILD = """import importlib, sys
sys.path.insert(0, sys.argv[1])
getattr(importlib.import_module(sys.argv[2]), sys.argv[3])(*sys.argv[4:])"""


def child(module: str, function: str, *args: object) -> list[str]:
    """The command that runs ``module.function(*args)`` (as strings) afresh."""
    return [sys.executable, "-c", CHILD, str(REPO), module, function, *map(str, args)]


def cli_then_peak(*argv: str) -> None:
    """In a fresh process (cold_lookup): ``embedcache ARGV``, then its peak RSS."""
    from embedcache.cli import main

    code = main(list(argv))
    print(f"hwm_mib={hwm_mib()}")
    sys.exit(code)


def hwm_mib() -> float:
    """Peak resident set (VmHWM, MiB): ru_maxrss carries a parent's over fork+exec."""
    with Path("/proc/self/status").open() as fh:
        line = next(x for x in fh if x.startswith("VmHWM"))
    return int(line.split()[1]) / 1024


def cold_lookup(
    model: str, store: str, known: Path, env: dict[str, str] | None = None
) -> tuple[float, float]:
    """Median seconds and peak RSS (MiB) of 3 fresh ``embed`` runs of ``known``'s
    sequences, every one stored (the benchmark exits if not)."""
    n = len(known.read_text().split())
    cmd = child(__name__, "cli_then_peak", "embed", "--model", model, "--store", store)
    cmd += ["--input", str(known), "--output"]
    runs = []
    for i in range(3):
        wall, done = run_timed([*cmd, str(known.with_name(f"o{i}.npy"))], env)
        out = done.stdout
        if f"computed=0 cached={n}" not in out:
            sys.exit(f"expected all {n} known sequences stored:\n{out}")
        runs.append((wall, float(out.split("hwm_mib=")[1].split()[0])))
    walls, rsss = zip(*runs, strict=True)
    return float(np.median(walls)), float(np.median(rsss))


class Server:
    """``embedcache serve`` on a free port of 127.0.0.1, ready when constructed."""

    def __init__(
        self, store: Path, model: str, log: Path, options: Sequence[str] = ()
    ) -> None:
        import httpx

        from embedcache.service import wire

        with socket.socket() as sock:  # a free port
            sock.bind(("127.0.0.1", 0))
            port = str(sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "embedcache.cli", "serve", "--store", str(store)]
        cmd += ["--model", model, "--device", "cpu", "--port", port, *options]
        self._log, env = log.open("w"), {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=STDOUT, env=env)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"server exited:\n{log.read_text()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + wire.ROUTE_READY, timeout=1).status_code == 200:
                    return
            time.sleep(0.2)
        sys.exit("server not ready after 300 s")

    def metric(self, name: str) -> float:
        """The sum of a metric's samples on /metrics."""
        import httpx

        from embedcache.service import wire

        text = httpx.get(self.url + wire.ROUTE_METRICS).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.split("{")[0].split(" ")[0] == name
        )

    def rss(self) -> int:
        import psutil

        return psutil.Process(self.proc.pid).memory_info().rss

    def stop(self) -> int:
        self.proc.terminate()
        code = self.proc.wait(120)
        self._log.close()
        return code
