"""``embedcache embed`` end to end, as a new user runs it: a fresh interpreter on a
fresh store, timed from launch to exit, with the engine's own compute time (its log
line) so that start-up is shown apart."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Sequence

ENGINE_LOG = re.compile(r"computed (\d+) sequences \((\d+) tokens\) in ([\d.]+) s")
REPO = Path(__file__).resolve().parents[1]


@dataclass
class CliRun:
    """One ``embedcache embed`` run: wall seconds from launch to exit, the engine's
    seconds (forward passes and commits), sequences computed, and its vectors."""

    wall: float
    engine: float
    computed: int
    vectors: np.ndarray

    @property
    def startup(self) -> float:
        """Everything but the engine's batches: imports, model load, planning, output."""
        return self.wall - self.engine

    def describe(self, n_tokens: int) -> str:
        return (
            f"{self.wall:.1f} s end to end = {n_tokens / self.wall:,.0f} tokens/s; "
            f"start-up excluded (engine {self.engine:.1f} s) {n_tokens / self.engine:,.0f} "
            f"tokens/s; start-up {self.startup:.1f} s"
        )


def embed_cli(
    folder: Path | str,
    seqs: Sequence[str],
    work: Path,
    *,
    dtype: str,
    options: Sequence[str] = (),
) -> CliRun:
    """``embedcache embed --model FOLDER OPTIONS --dtype DTYPE`` over ``seqs`` on a
    fresh store under ``work``; exits the benchmark if it fails or computes less than
    every distinct sequence."""
    work.mkdir(parents=True, exist_ok=True)
    inputs, output, store = work / "seqs.txt", work / "out.npy", work / "store"
    shutil.rmtree(store, ignore_errors=True)
    inputs.write_text("\n".join(seqs) + "\n")
    command = [
        sys.executable, "-m", "embedcache.cli", "embed", "--model", str(folder),
        *options, "--dtype", dtype, "--store", str(store),
        "--input", str(inputs), "--output", str(output), "--no-progress",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"embedcache embed failed:\n{done.stderr[-2000:]}")
    last = done.stdout.strip().splitlines()[-1]
    engine = ENGINE_LOG.search(done.stderr)
    if not last.startswith("computed=") or engine is None:
        sys.exit(f"unexpected output:\n{done.stdout[-500:]}\n{done.stderr[-1000:]}")
    computed = int(last.split()[0].split("=")[1])
    if computed != len(set(seqs)):
        sys.exit(f"embedcache embed printed {last!r}; expected every sequence computed")
    return CliRun(
        wall=wall,
        engine=float(engine.group(3)),
        computed=computed,
        vectors=np.load(output),
    )
