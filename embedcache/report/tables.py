"""Tables and figures for the report notebooks; prints nothing.

Tables are :class:`Table` objects (a polars frame plus caption) and figures are
:class:`Plot` objects (a matplotlib Figure): both render themselves in a notebook
(``_repr_html_`` / ``_repr_png_``) and as HTML (``to_html``), so a notebook cell is
one call. Figures are built with ``matplotlib.figure.Figure`` directly, never through
pyplot's global state. :mod:`embedcache.report.sections` arranges them into the report.

Everything shown from a version that is not comparable (``demo-v1``) carries the
label "not comparable to the leaderboard".
"""

from __future__ import annotations

import base64
import html
import io
import logging
import subprocess
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
from matplotlib.figure import Figure

from embedcache import __version__
from embedcache.analysis.leakage import METHOD as LEAKAGE_METHOD
from embedcache.analysis.stats import MEAN, percentile_ci
from embedcache.report.published import STATUS as PUBLISHED_STATUS

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from numpy.typing import NDArray

    from embedcache.analysis.evaluation import Evaluation
    from embedcache.analysis.probe import ProbeConfig
    from embedcache.data.subsets import Subset
    from embedcache.report.published import PublishedSource

logger = logging.getLogger(__name__)

NOT_COMPARABLE = "not comparable to the leaderboard"
NEQ = "≠"
CAVEATS = (
    (
        "Random train/test splits: near-duplicate windows can sit on both sides "
        "(only exact duplicates are removed)."
    ),
    (
        "Models pretrained on the human reference genome have seen every sequence, "
        "without its label."
    ),
)
_TABLE_CSS = (
    "border-collapse:collapse;font-family:sans-serif;font-size:13px;margin:4px 0 12px 0"
)
_CELL_CSS = "border:1px solid #ccc;padding:3px 8px;text-align:left"


@dataclass(frozen=True)
class Table:
    """A frame with a caption and a footnote that renders as plain HTML."""

    frame: pl.DataFrame
    caption: str = ""
    note: str = ""
    css_class: str = "embedcache"  # e.g. "embedcache published": styled apart

    def to_html(self) -> str:
        head = "".join(
            f'<th style="{_CELL_CSS};background:#f0f0f0">{html.escape(c)}</th>'
            for c in self.frame.columns
        )
        body = "".join(
            "<tr>"
            + "".join(
                f'<td style="{_CELL_CSS}">{html.escape(_cell(v))}</td>' for v in row
            )
            + "</tr>"
            for row in self.frame.iter_rows()
        )
        caption = (
            f'<caption style="caption-side:top;text-align:left;font-weight:bold;'
            f'padding:4px 0">{html.escape(self.caption)}</caption>'
            if self.caption
            else ""
        )
        note = (
            f'<p style="font-size:12px;color:#555;margin-top:0">{html.escape(self.note)}</p>'
            if self.note
            else ""
        )
        return (
            f'<div style="overflow-x:auto"><table class="{html.escape(self.css_class)}" '
            f'style="{_TABLE_CSS}">{caption}'
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>{note}"
        )

    def _repr_html_(self) -> str:
        return self.to_html()


@dataclass(frozen=True)
class Plot:
    """A matplotlib Figure that shows itself as an embedded PNG."""

    figure: Figure
    alt: str = "figure"  # the image's alternative text in the HTML report
    dpi: int = 110

    def to_png(self) -> bytes:
        buf = io.BytesIO()
        self.figure.savefig(buf, format="png", dpi=self.dpi, bbox_inches="tight")
        return buf.getvalue()

    def _repr_png_(self) -> tuple[bytes, dict[str, str]]:
        return self.to_png(), {"alt": self.alt}

    def to_html(self) -> str:
        """An ``<img>`` holding the PNG itself (base64): the page loads nothing."""
        data = base64.b64encode(self.to_png()).decode("ascii")
        return (
            f'<img src="data:image/png;base64,{data}" alt="{html.escape(self.alt)}" '
            'style="max-width:100%">'
        )


@dataclass(frozen=True)
class Html:
    """A fragment of HTML (banners, caveats) for a notebook cell."""

    text: str

    def to_html(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        return self.text


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _fmt_ci(low: float, high: float) -> str:
    return f"[{low:.3f}, {high:.3f}]"


def _label(evaluation: Evaluation, text: str) -> str:
    """Append the non-comparability label where the version asks for it."""
    if evaluation.comparable:
        return text
    return f"{text} ({evaluation.version}: {NOT_COMPARABLE})"


def git_commit(path: Path | None = None) -> str:
    """The git commit of the source tree at ``path`` (default: this package), or "unknown"."""
    where = path or Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=where,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = out.stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=where,
        capture_output=True,
        text=True,
        check=False,
        timeout=10,
    ).stdout.strip()
    return f"{commit} (uncommitted changes)" if dirty else commit


def run_table(parameters: Mapping[str, Any]) -> Table:
    """The notebook's parameters, package version and git commit."""
    rows = [("embedcache version", __version__), ("git commit", git_commit())]
    rows += [(name, repr(value)) for name, value in parameters.items()]
    return Table(
        pl.DataFrame(rows, schema=["parameter", "value"], orient="row"),
        "Run parameters",
        css_class="embedcache wrap",
    )


def store_keys_table(store_keys: Sequence[Any]) -> Table:
    """Every key in the store: digest, model, the options that set it apart, counts."""
    rows = []
    for info in store_keys:
        key = getattr(info, "key", info)
        rows.append(
            {
                "key digest": key.digest[:12],
                "model": key.model_id,
                "revision": key.revision[:19],
                "adapter": key.adapter,
                "rc mode": key.rc_mode,
                "dtype": key.dtype,
                "vectors": getattr(info, "n_vectors", None),
                "dim": getattr(info, "dim", None),
            }
        )
    frame = pl.DataFrame(
        rows,
        schema={
            "key digest": pl.Utf8,
            "model": pl.Utf8,
            "revision": pl.Utf8,
            "adapter": pl.Utf8,
            "rc mode": pl.Utf8,
            "dtype": pl.Utf8,
            "vectors": pl.Int64,
            "dim": pl.Int64,
        },
    )
    return Table(
        frame,
        "Store keys",
        "Every key in the store, scored or not; the full key of each scored model is "
        "under Provenance.",
    )


def leaderboard_table(evaluation: Evaluation, *, metric: str = "accuracy") -> Table:
    """rank, model, Value, 95% CI, n, ≠ and the paired difference to the top model."""
    ranking = evaluation.ranking(metric=metric)
    usual = evaluation.usual_n[MEAN]
    frame = pl.DataFrame(
        {
            "rank": ranking["rank"].to_list(),
            "model": ranking["model"].to_list(),
            "Value": [f"{v:.3f}" for v in ranking["value"]],
            "95% CI": [
                _fmt_ci(lo, hi)
                for lo, hi in zip(ranking["ci_low"], ranking["ci_high"], strict=True)
            ],
            "n": ranking["n"].to_list(),
            NEQ: [NEQ if n != usual else "" for n in ranking["n"]],
            "Δ to #1 [95% CI]": [
                "—" if d == 0 and lo == 0 and hi == 0 else f"{d:+.3f} {_fmt_ci(lo, hi)}"
                for d, lo, hi in zip(
                    -ranking["diff_to_best"],
                    -ranking["diff_ci_high"],
                    -ranking["diff_ci_low"],
                    strict=True,
                )
            ],
        },
        schema_overrides={"rank": pl.Int64},
    )
    what = "accuracy" if metric == "accuracy" else "macro F1"
    note = (
        f"Mean {what} of a logistic probe over {len(evaluation.datasets)} datasets (equal "
        f"weight); 95% percentile bootstrap CI, {evaluation.bootstrap.n_boot} resamples "
        f"within each dataset. Rank = 1 + number of models significantly better (paired "
        f"bootstrap CI of the difference entirely above 0); tied models share a rank. "
        f"{NEQ}: n differs from this board's usual n = {usual}."
    )
    if evaluation.fallback:
        note += (
            " The store holds no model besides the built-in k-mer floors, so they are "
            "ranked here for demonstration."
        )
    return Table(frame, _label(evaluation, f"Leaderboard ({what})"), note)


def dataset_table(evaluation: Evaluation, *, metric: str = "accuracy") -> Table:
    """Every model and floor per dataset: value [95% CI]; floors marked."""
    boot = evaluation.bootstrap
    data: dict[str, list[str]] = {
        "model": [e.name for e in evaluation.entries],
        "kind": ["floor" if e.is_floor else "model" for e in evaluation.entries],
    }
    for name in (*evaluation.datasets, MEAN):
        point = boot.point(metric, name)
        low, high = percentile_ci(boot.samples(metric, name), level=boot.level)
        n = boot.n(name)
        mark = f" {NEQ}" if n != evaluation.usual_n[name] else ""
        idx = [boot.models.index(e.name) for e in evaluation.entries]
        data[f"{name} (n={n}{mark})"] = [
            f"{point[i]:.3f} {_fmt_ci(low[i], high[i])}" for i in idx
        ]
    what = "Accuracy" if metric == "accuracy" else "Macro F1"
    return Table(
        pl.DataFrame(data),
        _label(evaluation, f"{what} per dataset [95% CI]"),
        "Floors are trivial baselines on the same items, unranked.",
    )


def floors_table(evaluation: Evaluation) -> Table:
    """Majority class, GC fraction and the best k-mer probe, every K listed below them."""
    boot = evaluation.bootstrap
    best = evaluation.best_kmer()
    kmers = sorted(
        (
            e
            for e in evaluation.entries
            if e.key is not None and e.key.adapter == "kmer"
        ),
        key=lambda e: e.name,
    )
    floors = [e for e in evaluation.entries if e.key is None]
    floors += [
        e for e in evaluation.entries if e.key is not None and e.key.adapter == "gc"
    ]
    floors += [  # random-init twins: the architecture without pretraining
        e
        for e in evaluation.entries
        if e.key is not None and e.key.revision.startswith("random-init:")
    ]
    floors += [best] if best is not None else []
    floors += [e for e in kmers if e is not best]
    rows = []
    for e in floors:
        i = boot.models.index(e.name)
        row: dict[str, str] = {
            "floor": e.name + (" (best K)" if e is best else ""),
        }
        for name in (*evaluation.datasets, MEAN):
            low, high = percentile_ci(
                boot.samples("accuracy", name)[:, i], level=boot.level
            )
            row[name] = (
                f"{boot.point('accuracy', name)[i]:.3f} {_fmt_ci(float(low), float(high))}"
            )
        row["mean macro F1"] = f"{boot.point('macro_f1')[i]:.3f}"
        rows.append(row)
    note = (
        "Unranked. Majority: the most frequent train label of each dataset. gc: the "
        "same probe on one feature, the GC fraction (G+C)/(A+C+G+T). Random init: a "
        "model's architecture with seeded random weights, a control. kmer-K: the "
        "same probe on normalised K-mer spectra; the best K (highest mean test accuracy, "
        "a deliberately generous floor) comes first."
    )
    return Table(
        pl.DataFrame(rows), _label(evaluation, "Floors (accuracy [95% CI])"), note
    )


def describe_grid(grid: Sequence[float]) -> str:
    """``17 values, 1e-4 to 1e4 in half-decade steps (numpy.logspace(-4, 4, 17))``.

    A grid that is not evenly spaced in log10 is listed value by value.
    """
    exps = np.log10(np.asarray(grid, dtype=np.float64))
    n = len(grid)
    if n >= 3 and np.allclose(np.diff(exps), exps[1] - exps[0]):
        lo, hi = float(exps[0]), float(exps[-1])
        step = (hi - lo) / (n - 1)
        steps = {1.0: "decade steps", 0.5: "half-decade steps"}.get(
            round(step, 9), f"steps of 10^{step:g}"
        )
        return (
            f"{n} values, 1e{lo:g} to 1e{hi:g} in {steps} "
            f"(numpy.logspace({lo:g}, {hi:g}, {n}))"
        )
    return f"{n} values ({', '.join(f'{c:.3g}' for c in grid)})"


def probe_description(cfg: ProbeConfig) -> str:
    """The probe protocol in one readable sentence (grid written out, not a repr)."""
    return (
        f"StandardScaler + LogisticRegression (lbfgs, l2, max_iter {cfg.max_iter}); "
        f"C among {describe_grid(cfg.c_grid)} by {cfg.n_folds}-fold stratified CV "
        f"on log-loss inside train (fold seed {cfg.cv_seed}, scaler refit within each "
        "fold, ties to the smaller C), then refit on all train items."
    )


def probe_table(evaluation: Evaluation) -> Table:
    """The C each probe chose per dataset and its CV log-loss."""
    note = probe_description(evaluation.probe_config)
    frame = evaluation.probes
    if frame.height:
        # C spans 1e-4..1e2: a fixed 3-decimal format would print 0.000
        frame = frame.with_columns(
            pl.col("C").map_elements(lambda c: f"{c:.3g}", return_dtype=pl.Utf8)
        )
    return Table(frame, _label(evaluation, "Probe fits"), note)


def leakage_table(leakage: pl.DataFrame) -> Table:
    """Share of test items duplicated in the drawn train, per dataset."""
    frame = leakage.select(
        "dataset",
        "n_test",
        "n_train",
        pl.format(
            "{} ({}%)", "exact_dup", (pl.col("exact_share") * 100).round(2)
        ).alias("exact duplicate"),
        pl.format("{} ({}%)", "rc_dup", (pl.col("rc_share") * 100).round(2)).alias(
            "reverse-complement duplicate"
        ),
        pl.format("{} ({}%)", "near_dup", (pl.col("near_share") * 100).round(2)).alias(
            "near duplicate"
        ),
    )
    return Table(
        frame,
        "Leakage audit: test items found in the drawn train",
        f"Near duplicate: {LEAKAGE_METHOD}.",
    )


def provenance_table(
    evaluation: Evaluation, subset: Subset, *, created: datetime | None = None
) -> Table:
    """Dataset sources, revisions and file hashes, subset id, versions, probe, date."""
    from embedcache.data.datasets import dataset_spec

    rows: list[tuple[str, str]] = [
        (
            "version",
            evaluation.version
            + ("" if evaluation.comparable else f" ({NOT_COMPARABLE})"),
        ),
        ("subset id", evaluation.subset_id),
    ]
    for name in evaluation.datasets:
        spec = dataset_spec(name)
        rows.append((f"dataset {name}", f"{spec.repo_id}@{spec.revision}"))
    for record in subset.provenance():
        files = (
            ", ".join(f"{f['name']} sha256 {f['sha256']}" for f in record["files"])
            or "-"
        )
        rows.append(
            (
                f"source {record['dataset']}/{record['split']}",
                f"{record['source']}: {files}",
            )
        )
    rows += [
        ("embedcache version", __version__),
        ("git commit", git_commit()),
        ("probe", probe_description(evaluation.probe_config)),
        (
            "bootstrap",
            (
                f"{evaluation.bootstrap.n_boot} resamples of test items within each "
                f"dataset, seed {evaluation.seed}"
            ),
        ),
        ("date", _fmt_date(created)),
    ]
    return Table(
        pl.DataFrame(rows, schema=["field", "value"], orient="row"),
        "Provenance",
        css_class="embedcache wrap",  # long file hashes wrap instead of widening the page
    )


def _fmt_date(when: datetime | None) -> str:
    return (when or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M UTC")


def model_keys_table(evaluation: Evaluation) -> Table:
    """The full key of every scored model and k-mer floor: one row each, one column a field."""
    from embedcache.specs import ModelKey

    names = [f.name for f in fields(ModelKey)]
    rows = []
    for e in evaluation.entries:
        if e.key is None:
            continue
        row = {"model": e.name}
        for name in names:
            value = getattr(e.key, name)
            if name == "options":
                value = ", ".join(f"{k}={v}" for k, v in value) or "-"
            row[name] = "-" if value is None else str(value)
        row["key digest"] = e.key.digest
        rows.append(row)
    frame = pl.DataFrame(
        rows, schema=dict.fromkeys(["model", *names, "key digest"], pl.Utf8)
    )
    return Table(
        frame,
        "Model keys",
        "Everything that changes a vector; the store names a key by the sha256 of its "
        "canonical JSON (the key digest). The majority floor has no key.",
    )


def published_table(source: PublishedSource, datasets: Sequence[str]) -> Table:
    """A source's published numbers as context rows: marked, with its differences."""
    rows = []
    for row in source.rows:
        ci = (
            _fmt_ci(row.ci_low, row.ci_high)
            if row.ci_low is not None and row.ci_high is not None
            else "not published"
        )
        entry: dict[str, str] = {
            "model (as published)": row.model,
            "Value": f"{row.mean:.3f}",
            "95% CI": ci,
        }
        for name in datasets:
            value = row.datasets.get(name)
            entry[name] = "-" if value is None else f"{value:.3f}"
        entry["macro F1"] = "-" if row.macro_f1 is None else f"{row.macro_f1:.3f}"
        entry["n"] = "-" if source.n_test is None else str(source.n_test)
        entry["status"] = PUBLISHED_STATUS
        rows.append(entry)
    note = (
        f"Context, never ranked: {source.metric}, from {source.citation}. "
        f"Differs from this board: {'; '.join(source.differences)}."
    )
    return Table(
        pl.DataFrame(rows),
        f"{source.title}: {PUBLISHED_STATUS}",
        note,
        css_class="embedcache published",
    )


def caveats(evaluation: Evaluation, leakage: pl.DataFrame | None = None) -> Html:
    """The protocol's caveats, the leakage found, and non-comparability (a list)."""
    items = list(CAVEATS)
    if leakage is not None and leakage.height:
        worst = leakage.sort("near_share", descending=True).row(0, named=True)
        items.append(
            f"Leakage audit: up to {worst['near_share'] * 100:.1f}% of a dataset's test items "
            f"({worst['dataset']}) have a near duplicate in the drawn train ({LEAKAGE_METHOD})."
        )
    if not evaluation.comparable:
        items.insert(
            0,
            f"{evaluation.version} is {NOT_COMPARABLE}: it scores a small bundled sample "
            "with a self-split, not the leaderboard's items.",
        )
    body = "".join(f"<li>{html.escape(t)}</li>" for t in items)
    return Html(f'<ul class="caveats">{body}</ul>')


def accuracy_figure(evaluation: Evaluation, *, metric: str = "accuracy") -> Plot:
    """Per-dataset score with 95% CI bars for every model and floor."""
    boot = evaluation.bootstrap
    names = [e.name for e in evaluation.entries]
    panels = (*evaluation.datasets, MEAN)
    fig = Figure(figsize=(3.2 * len(panels), 0.45 * len(names) + 1.6))
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    y = np.arange(len(names))[::-1]
    for ax, name in zip(axes, panels, strict=True):
        point = boot.point(metric, name)
        low, high = percentile_ci(boot.samples(metric, name), level=boot.level)
        for j, e in enumerate(evaluation.entries):
            i = boot.models.index(e.name)
            colour = "#888888" if e.is_floor and not evaluation.fallback else "#1f77b4"
            if e.key is None:
                colour = "#888888"
            ax.errorbar(
                point[i],
                y[j],
                xerr=[[point[i] - low[i]], [high[i] - point[i]]],
                fmt="s" if e.is_floor else "o",
                color=colour,
                capsize=3,
            )
        ax.axvline(0.5, color="#cccccc", lw=1, ls="--")
        ax.set_title(f"{name}\n(n={boot.n(name)})", fontsize=9)
        ax.set_xlabel(metric.replace("_", " "))
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(y, names, fontsize=8)
    fig.suptitle(
        _label(evaluation, f"{metric.replace('_', ' ')} per dataset, 95% bootstrap CI"),
        fontsize=10,
    )
    fig.tight_layout()
    return Plot(fig, alt=f"{metric} per dataset with 95% CI bars, per model and floor")


def paired_difference_figure(
    evaluation: Evaluation, *, metric: str = "accuracy"
) -> Plot:
    """Paired bootstrap difference (model - best ranked model) of the mean, with 95% CI."""
    paired = evaluation.paired(metric=metric)
    reference = paired["reference"][0]
    diff = -paired["difference"].to_numpy()
    low, high = -paired["ci_high"].to_numpy(), -paired["ci_low"].to_numpy()
    names = paired["model"].to_list()
    same = paired["indistinguishable"].to_list()
    fig = Figure(figsize=(7, 0.4 * len(names) + 1.4))
    ax = fig.subplots()
    y = np.arange(len(names))[::-1]
    for j in range(len(names)):
        ax.errorbar(
            diff[j],
            y[j],
            xerr=[[diff[j] - low[j]], [high[j] - diff[j]]],
            fmt="o",
            color="#2ca02c" if same[j] else "#d62728",
            capsize=3,
        )
    ax.axvline(0, color="black", lw=1)
    ax.set_yticks(y, names, fontsize=8)
    ax.set_xlabel(f"mean {metric.replace('_', ' ')} minus {reference}")
    ax.set_title(
        _label(
            evaluation,
            "Paired bootstrap difference to the top model (green: CI contains 0)",
        ),
        fontsize=10,
    )
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return Plot(fig, alt=f"paired bootstrap difference of mean {metric} to {reference}")


def projection_figure(
    vectors: Mapping[str, NDArray[np.floating]],
    labels: Mapping[str, NDArray[np.integer]],
    *,
    title: str = "",
) -> Plot:
    """PCA of each dataset's vectors to 2-D, points coloured by label."""
    from sklearn.decomposition import PCA
    from sklearn.preprocessing import StandardScaler

    names = list(vectors)
    fig = Figure(figsize=(4.2 * len(names), 4))
    axes = fig.subplots(1, len(names), squeeze=False)[0]
    for ax, name in zip(axes, names, strict=True):
        x = StandardScaler().fit_transform(np.asarray(vectors[name], dtype=np.float64))
        xy = PCA(n_components=2, random_state=0).fit_transform(x)
        y = np.asarray(labels[name])
        for lab, colour in ((0, "#1f77b4"), (1, "#ff7f0e")):
            pts = xy[y == lab]
            ax.scatter(
                pts[:, 0], pts[:, 1], s=6, alpha=0.5, color=colour, label=f"label {lab}"
            )
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("PC 1")
        ax.set_ylabel("PC 2")
        ax.legend(fontsize=8, markerscale=2)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return Plot(fig, alt=title or "2-D PCA projection coloured by label")
