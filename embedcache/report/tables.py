"""The board's tables: leaderboard, per dataset, floors, probes, leakage, published rows.

Each function takes an :class:`~embedcache.analysis.evaluation.Evaluation` (or a
frame) and returns a :class:`~embedcache.report.parts.Table`; :func:`caveats` returns
the protocol's caveats as :class:`~embedcache.report.parts.Html`. Everything shown
from a version that is not comparable (``demo-v1``) carries the label "not
comparable to the leaderboard". :mod:`embedcache.report.sections` arranges them.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from embedcache.analysis.bootstrap import MEAN, percentile_ci
from embedcache.analysis.leakage import METHOD as LEAKAGE_METHOD
from embedcache.report.overlap import OVERLAP_NOTE, entry_overlap, name_overlap
from embedcache.report.parts import (
    NOT_COMPARABLE,
    Html,
    Table,
    comparable_title,
    fmt_ci,
)
from embedcache.report.published import STATUS as PUBLISHED_STATUS

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from embedcache.analysis.evaluation import Evaluation
    from embedcache.analysis.probe import ProbeConfig
    from embedcache.report.overlap import Declaration
    from embedcache.report.published import PublishedSource

NEQ = "≠"
REPRODUCED = "reproduced"  # the hub's word for a row computed here from the store
PUBLISHED = "published"
BY_DATASET = "By dataset"
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


def by_dataset_details(evaluation: Evaluation, model: str, *, metric: str) -> str:
    """A row's per-dataset values, CI and n in a closed ``<details>`` (no script)."""
    boot = evaluation.bootstrap
    i = boot.models.index(model)
    rows = []
    for name in evaluation.datasets:
        low, high = percentile_ci(boot.samples(metric, name)[:, i], level=boot.level)
        rows.append(
            f"<tr><td>{html.escape(name)}</td>"
            f"<td>{boot.point(metric, name)[i]:.3f}</td>"
            f"<td>{fmt_ci(float(low), float(high))}</td><td>{boot.n(name)}</td></tr>"
        )
    head = "<tr><th>dataset</th><th>Value</th><th>95% CI</th><th>n</th></tr>"
    k = len(evaluation.datasets)
    return (
        f'<details class="ec-by-dataset"><summary>{BY_DATASET}: {k} levels</summary>'
        f'<table style="font-size:12px">{head}{"".join(rows)}</table></details>'
    )


def leaderboard_table(
    evaluation: Evaluation,
    *,
    metric: str = "accuracy",
    declared: Mapping[str, Declaration] | None = None,
) -> Table:
    """rank, model, Value, 95% CI, n, ≠, the paired difference to the top model,
    Source, Overlap (:mod:`embedcache.report.overlap`) and the row's per-dataset values.
    """
    ranking = evaluation.ranking(metric=metric)
    usual = evaluation.usual_n[MEAN]
    entries = {e.name: e for e in evaluation.entries}
    frame = pl.DataFrame(
        {
            "rank": ranking["rank"].to_list(),
            "model": ranking["model"].to_list(),
            "Value": [f"{v:.3f}" for v in ranking["value"]],
            "95% CI": [
                fmt_ci(lo, hi)
                for lo, hi in zip(ranking["ci_low"], ranking["ci_high"], strict=True)
            ],
            "n": ranking["n"].to_list(),
            NEQ: [NEQ if n != usual else "" for n in ranking["n"]],
            "Δ to #1 [95% CI]": [
                "—" if d == 0 and lo == 0 and hi == 0 else f"{d:+.3f} {fmt_ci(lo, hi)}"
                for d, lo, hi in zip(
                    -ranking["diff_to_best"],
                    -ranking["diff_ci_high"],
                    -ranking["diff_ci_low"],
                    strict=True,
                )
            ],
            "Source": [REPRODUCED] * ranking.height,
            "Overlap": [entry_overlap(entries[m], declared) for m in ranking["model"]],
            BY_DATASET: [
                by_dataset_details(evaluation, m, metric=metric)
                for m in ranking["model"]
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
        f"{NEQ}: n differs from this board's usual n = {usual}. Source: {REPRODUCED} "
        f"(computed here from the store; published rows are context, never ranked). "
        f"{OVERLAP_NOTE}"
    )
    if evaluation.fallback:
        note += (
            " The store holds no model besides the built-in k-mer floors, so they are "
            "ranked here for demonstration."
        )
    return Table(
        frame,
        comparable_title(evaluation, f"Leaderboard ({what})"),
        note,
        raw_columns=(BY_DATASET,),
    )


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
            f"{point[i]:.3f} {fmt_ci(low[i], high[i])}" for i in idx
        ]
    what = "Accuracy" if metric == "accuracy" else "Macro F1"
    return Table(
        pl.DataFrame(data),
        comparable_title(evaluation, f"{what} per dataset [95% CI]"),
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
                f"{boot.point('accuracy', name)[i]:.3f} {fmt_ci(float(low), float(high))}"
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
        pl.DataFrame(rows),
        comparable_title(evaluation, "Floors (accuracy [95% CI])"),
        note,
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
    return Table(frame, comparable_title(evaluation, "Probe fits"), note)


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


def published_table(
    source: PublishedSource,
    datasets: Sequence[str],
    *,
    declared: Mapping[str, Declaration] | None = None,
) -> Table:
    """A source's published numbers as context rows: marked, with its differences."""
    rows = []
    for row in source.rows:
        ci = (
            fmt_ci(row.ci_low, row.ci_high)
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
        entry["Source"] = PUBLISHED
        entry["Overlap"] = name_overlap(row.model, declared)
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
