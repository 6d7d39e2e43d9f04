"""Benchmark results as data: one JSON record per run, appended to the committed
``benchmarks/results/<benchmark>.jsonl``: its machine (CPU kind, matmul peaks, load),
commit, and every figure with its unit and target (``">= 0.9"``), if any."""

from __future__ import annotations

import datetime as dt
import json
import operator
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
COMPARE = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}


class RecordError(ValueError):
    """A figure or record that cannot be written or read as it stands."""


@dataclass(frozen=True, slots=True)
class Figure:
    """One figure a benchmark prints: its value, unit and target (if any)."""

    value: float
    unit: str = ""
    target: str | None = None  # e.g. ">= 0.9": the value must satisfy it

    def meets(self) -> bool | None:
        """Whether the value meets the target; None where there is none."""
        if self.target is None:
            return None
        op, bound = parse_target(self.target)
        return COMPARE[op](self.value, bound)


def parse_target(target: str) -> tuple[str, float]:
    """``">= 0.9"`` -> (">=", 0.9)."""
    parts = target.split()
    if len(parts) != 2 or parts[0] not in COMPARE:
        msg = f"target {target!r}: expected '<op> <number>' with op one of {[*COMPARE]}"
        raise RecordError(msg)
    try:
        return parts[0], float(parts[1].replace(",", ""))
    except ValueError as err:
        msg = f"target {target!r}: {parts[1]!r} is not a number"
        raise RecordError(msg) from err


def git_commit() -> str:
    """The checkout's commit (``+dirty`` when it has uncommitted changes)."""

    def git(*args: str) -> str:
        cmd = ["git", "-C", str(RESULTS.parent), *args]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    dirty = "+dirty" * bool(git("status", "--porcelain", "--untracked-files=no"))
    return (git("rev-parse", "--short=12", "HEAD") or "unknown") + dirty


def record(
    benchmark: str,
    figures: dict[str, Figure],
    *,
    quick: bool,
    peaks: dict[str, float],
    argv: list[str] | None = None,
    results: Path = RESULTS,
) -> Path:
    """Append this run's record to ``results/<benchmark>.jsonl`` (``peaks``: the
    matmul rates measured beside the run), print its figures; the file's path."""
    from embedcache.models.shared.cpu_features import cpu_kind

    for name, fig in figures.items():
        if not isinstance(fig, Figure):
            msg = f"figure {name!r} of {benchmark}: expected a Figure, got {fig!r}"
            raise RecordError(msg)
        fig.meets()  # parses its target: a malformed one is refused before writing
    rec = {
        "benchmark": benchmark,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "cpu_kind": cpu_kind(),
        "peaks_gflops": {
            k: round(peaks[k] / 1e9, 1) for k in ("float32", "bfloat16") if k in peaks
        },
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "quick": quick,
        "argv": list(sys.argv[1:] if argv is None else argv),
        "figures": {name: asdict(fig) for name, fig in figures.items()},
    }
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{benchmark}.jsonl"
    with path.open("a") as fh:
        fh.write(json.dumps(rec) + "\n")
    width = max(map(len, figures), default=0)
    for name, fig in figures.items():
        verdict = {True: "meets", False: "BELOW", None: ""}[fig.meets()]
        target = f"({fig.target})" if fig.target else ""
        print(f"  {name:<{width}}  {fig.value:>12,} {fig.unit:<9} {target} {verdict}")
    print(f"record appended to {path}")
    return path


def load_records(results: Path = RESULTS) -> list[dict]:
    """Every record under ``results``, oldest first."""
    out = []
    for path in sorted(results.glob("*.jsonl")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as err:
                err.add_note(f"while reading {path}, line {i}")
                raise
    return sorted(out, key=lambda r: r["date"])
