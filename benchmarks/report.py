"""The docs' benchmarks page, generated from the records (benchmarks/records.py):
the latest figures per benchmark and CPU kind, each beside its target, a history
plot, and the one command that reproduces each."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from typing import TYPE_CHECKING

from benchmarks.records import Figure, parse_target

if TYPE_CHECKING:
    from pathlib import Path

PLOT = "benchmarks-history.svg"
VERDICT = {True: "meets", False: "**below**", None: ""}
INTRO = """<!-- generated from benchmarks/results/ by scripts/docs_pages.py -->

Every run of a benchmark (`python -m benchmarks list` names them, `python -m benchmarks
run NAME [--quick]` runs one) appends a record to `benchmarks/results/NAME.jsonl`:
commit, date, CPU kind, both matmul peaks, load average and every figure it printed.
This page shows the newest record per benchmark and CPU kind. A load average above the
core count slows absolute figures; ratios measured side by side move less; `--quick`
runs are smaller and noisier. A new benchmark is a module of `benchmarks/` with a
docstring and a `main(argv)` that takes `--quick` and ends with `records.record(...)`.
"""


def latest(records: list[dict]) -> dict[tuple[str, str], dict]:
    """The newest record of each (benchmark, CPU kind)."""
    by_date = sorted(records, key=lambda r: r["date"])
    return dict(sorted({(r["benchmark"], r["cpu_kind"]): r for r in by_date}.items()))


def _section(rec: dict) -> list[str]:
    peaks = rec["peaks_gflops"]
    load = ", ".join(f"{x:.1f}" for x in rec["load_average"])
    command = " ".join(["python -m benchmarks run", rec["benchmark"], *rec["argv"]])
    lines = [
        f"### {rec['benchmark']} on {rec['cpu_kind']}",
        "",
        (
            f"{rec['date']}, commit `{rec['commit']}`, matmul fp32 "
            f"{peaks.get('float32', 0):.1f} / bf16 {peaks.get('bfloat16', 0):.1f} GFLOP/s, "
            f"load average {load}{' (`--quick`)' if rec['quick'] else ''}. "
            f"Reproduce: `{command}`"
        ),
        "",
        "| figure | value | target | |",
        "| --- | ---: | --- | --- |",
    ]
    for name, fig in rec["figures"].items():
        figure = Figure(**fig)
        value = f"{figure.value:,}" if isinstance(figure.value, int) else figure.value
        target, verdict = figure.target or "", VERDICT[figure.meets()]
        lines.append(f"| {name} | {value} {figure.unit} | {target} | {verdict} |")
    return [*lines, ""]


def render_benchmarks_page(records: list[dict], *, plot: str | None = PLOT) -> str:
    """The benchmarks page (markdown) for ``records``; ``plot``: the history plot's
    path relative to the page (None: no plot)."""
    lines = ["# Benchmarks", "", *INTRO.splitlines(), ""]
    if not records:
        return "\n".join([*lines, "No records yet.", ""])
    if plot:
        history = "Each figure with a target over time, as value / target:"
        lines += ["## History", "", history, "", f"![benchmark history]({plot})", ""]
    lines += ["## Latest figures", ""]
    for rec in latest(records).values():
        lines += _section(rec)
    return "\n".join(lines)


def write_history_plot(records: list[dict], path: Path) -> Path:
    """One panel per benchmark: each targeted figure's value over its target, by
    date, a marker per CPU kind. SVG or PNG by ``path``'s suffix."""
    import matplotlib as mpl

    mpl.use("Agg")
    import matplotlib.pyplot as plt

    series = defaultdict(lambda: defaultdict(list))  # {benchmark: {(figure, kind): []}}
    for rec in sorted(records, key=lambda r: r["date"]):
        when = dt.datetime.fromisoformat(rec["date"])
        for name, fig in rec["figures"].items():
            bound = fig["target"] and parse_target(fig["target"])[1]
            if bound:
                point = (when, fig["value"] / bound)
                series[rec["benchmark"]][name, rec["cpu_kind"]].append(point)
    names = sorted(series) or ["(no targeted figures)"]
    fig, axes = plt.subplots(
        len(names), 1, figsize=(9, 2.6 * len(names)), squeeze=False
    )
    kinds = sorted({kind for s in series.values() for _, kind in s})
    for ax, bench in zip(axes[:, 0], names, strict=True):
        for (figure, kind), points in series.get(bench, {}).items():
            dates, values = zip(*points, strict=True)
            marker = "os^vD*"[kinds.index(kind) % 6]
            ax.plot(dates, values, marker=marker, label=f"{figure} ({kind})")
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        ax.set_title(bench, fontsize=10)
        ax.set_ylabel("value / target")
        ax.tick_params(axis="x", labelrotation=20, labelsize=7)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
