"""Tables and figures of the analyses (leakage-clean accuracy, clusters, curves).

Independent functions in the style of :mod:`embedcache.report.tables` (they return
:class:`~embedcache.report.parts.Table` and :class:`~embedcache.report.parts.Plot`), so a report
notebook shows each with one call. Everything from a non-comparable version carries
the "not comparable to the leaderboard" label.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import polars as pl
from matplotlib.figure import Figure

from embedcache.analysis.bootstrap import MEAN, percentile_ci
from embedcache.analysis.clusters import METHOD as CLUSTER_METHOD
from embedcache.analysis.layers import layer_label
from embedcache.analysis.leakage import CONTAINMENT_METHOD
from embedcache.analysis.leakage import METHOD as LEAKAGE_METHOD
from embedcache.analysis.leakage import audit_table as audit_frame
from embedcache.report.parts import Plot, Table, comparable_title

if TYPE_CHECKING:
    from embedcache.analysis.evaluation import Evaluation
    from embedcache.analysis.suite import Analyses

logger = logging.getLogger(__name__)


def _ci(low: float, high: float) -> str:
    if np.isnan(low) or np.isnan(high):
        return "—"
    return f"[{low:.3f}, {high:.3f}]"


def _value(value: float) -> str:
    return "—" if np.isnan(value) else f"{value:.3f}"


def _share(count: int, share: float | None) -> str:
    return f"{count} ({100 * (share or 0.0):.2f}%)"


def leakage_audit_table(analyses: Analyses) -> Table:
    """Exact, reverse-complement, near and contained duplicates in the drawn train."""
    frame = audit_frame(analyses.audits)
    rows = [
        {
            "dataset": r["dataset"],
            "n_test": r["n_test"],
            "n_train": r["n_train"],
            "exact duplicate": _share(r["exact_dup"], r["exact_share"]),
            "reverse-complement duplicate": _share(r["rc_dup"], r["rc_share"]),
            "near duplicate": _share(r["near_dup"], r["near_share"]),
            "clean items": r["n_clean"],
            "contained (reported only)": _share(
                r["contained_dup"], r["contained_share"]
            ),
        }
        for r in frame.iter_rows(named=True)
    ]
    return Table(
        pl.DataFrame(rows),
        "Leakage audit: test items found in the drawn train",
        f"Near duplicate: {LEAKAGE_METHOD}; it includes exact and reverse-complement "
        "duplicates, and the clean items (accuracy_clean) are the rest. Contained: "
        f"{CONTAINMENT_METHOD}, a second rate that also catches a window inside a "
        "longer sequence; reported, not used to define clean items.",
    )


def full_train_table(analyses: Analyses) -> Table:
    """Test items with a duplicate anywhere in the full published train (context only)."""
    frame = analyses.full_train
    if frame is None or frame.height == 0:
        return Table(pl.DataFrame({"note": ["full-train audit not run"]}))
    rows = []
    for r in frame.iter_rows(named=True):
        if r["n_full_train"] is None:
            rows.append(
                {
                    "dataset": r["dataset"],
                    "n_test": r["n_test"],
                    "full train": "not available here",
                    "exact": "",
                    "reverse complement": "",
                    "near duplicate": "",
                    "contained": "",
                }
            )
            continue
        n = max(r["n_test"], 1)
        rows.append(
            {
                "dataset": r["dataset"],
                "n_test": r["n_test"],
                "full train": f"{r['n_full_train']} ({r['source']})",
                "exact": _share(r["exact_dup"], r["exact_dup"] / n),
                "reverse complement": _share(r["rc_dup"], r["rc_dup"] / n),
                "near duplicate": _share(r["near_dup"], r["near_share"]),
                "contained": _share(r["contained_dup"], r["contained_share"]),
            }
        )
    return Table(
        pl.DataFrame(rows),
        "Full-train audit: test items with a duplicate anywhere in the published train",
        "Context for comparisons with fine-tuned models, which train on the whole "
        "published train file; shown, never used in scoring. Same rules as the audit "
        "above. 'Not available here': the version did not read that file (a self-split, "
        "or no hub cache or mirror holds it).",
    )


def clean_table(evaluation: Evaluation, analyses: Analyses) -> Table:
    """Mean accuracy beside leakage-clean accuracy, their paired gap, and rank changes."""
    clean = analyses.clean
    boot = evaluation.bootstrap
    acc = boot.point("accuracy")
    a_low, a_high = percentile_ci(boot.samples("accuracy"), level=boot.level)
    c_point = clean.point()
    c_low, c_high = (
        percentile_ci(clean.samples(), level=boot.level)
        if clean.complete
        else (c_point, c_point)
    )
    gap = clean.gap.frame().filter(pl.col("dataset") == MEAN)
    gap_c = (
        clean.gap_clustered.frame().filter(pl.col("dataset") == MEAN)
        if clean.gap_clustered is not None
        else None
    )
    ranks = {r["model"]: r for r in analyses.rank_changes.iter_rows(named=True)}
    rows = []
    for e in evaluation.entries:
        i = boot.models.index(e.name)
        g = gap.row(i, named=True)
        rank = ranks.get(e.name)
        row = {
            "model": e.name + (" (floor)" if e.is_floor and rank is None else ""),
            "accuracy [95% CI]": f"{acc[i]:.3f} {_ci(a_low[i], a_high[i])}",
            f"accuracy_clean (n={clean.n_clean[MEAN]}) [95% CI]": (
                f"{_value(c_point[i])} {_ci(c_low[i], c_high[i])}"
            ),
            "accuracy - clean [item CI]": (
                f"{g['difference']:+.3f} {_ci(g['ci_low'], g['ci_high'])}"
                if not np.isnan(g["difference"])
                else "—"
            ),
        }
        if gap_c is not None:
            gc = gap_c.row(i, named=True)
            row["[cluster CI]"] = _ci(gc["ci_low"], gc["ci_high"])
        row["rank"] = "" if rank is None else str(rank["rank"])
        row["rank (clean)"] = (
            ""
            if rank is None or rank["rank_clean"] is None
            else str(rank["rank_clean"])
        )
        row["flag"] = (
            "rank changes" if rank is not None and rank["rank_changed"] else ""
        )
        rows.append(row)
    per = ", ".join(f"{d}: {clean.n_clean[d]}" for d in evaluation.datasets)
    note = (
        f"accuracy_clean: the same probe's accuracy on the clean test items only (no "
        f"exact, reverse-complement or near duplicate in the drawn train; {per}), with "
        f"the protocol's bootstrap over those items; the mean weighs datasets equally. "
        f"The gap is bootstrapped paired (both accuracies from one resample of all test "
        f"items; the cluster CI resamples near-duplicate clusters instead). A positive "
        f"gap: the model does better on leaked items. Ranks follow the board's rule, "
        f"on accuracy and on accuracy_clean; 'rank changes' flags a model whose rank "
        f"differs."
    )
    if not clean.complete:
        note += (
            " A dataset has no clean item, so the mean accuracy_clean is undefined (—)."
        )
    return Table(
        pl.DataFrame(rows),
        comparable_title(evaluation, "Leakage-clean accuracy (mean over datasets)"),
        note,
    )


def clean_dataset_table(evaluation: Evaluation, analyses: Analyses) -> Table:
    """Per dataset: accuracy_clean [CI] (n clean) and the gap [item CI] per model."""
    clean = analyses.clean
    gap = clean.gap.frame()
    data: dict[str, list[str]] = {"model": [e.name for e in evaluation.entries]}
    level = evaluation.bootstrap.level
    for d in evaluation.datasets:
        point = clean.point(d)
        if clean.n_clean[d]:
            low, high = percentile_ci(clean.samples(d), level=level)
        else:
            low = high = point
        g = gap.filter(pl.col("dataset") == d)
        col = []
        for e in evaluation.entries:
            i = clean.models.index(e.name)
            gr = g.row(i, named=True)
            diff = (
                "—"
                if np.isnan(gr["difference"])
                else f"{gr['difference']:+.3f} {_ci(gr['ci_low'], gr['ci_high'])}"
            )
            col.append(f"{_value(point[i])} {_ci(low[i], high[i])}; gap {diff}")
        data[f"{d} (n clean={clean.n_clean[d]})"] = col
    return Table(
        pl.DataFrame(data),
        comparable_title(
            evaluation, "accuracy_clean per dataset [95% CI]; gap = accuracy - clean"
        ),
    )


def cluster_table(evaluation: Evaluation, analyses: Analyses) -> Table:
    """Accuracy with the item CI (headline) beside the cluster CI, per dataset and mean."""
    item = evaluation.bootstrap
    clus = analyses.clustered.bootstrap
    counts = analyses.clustered.n_clusters
    data: dict[str, list[str]] = {"model": [e.name for e in evaluation.entries]}
    for d in (*evaluation.datasets, MEAN):
        point = item.point("accuracy", d)
        i_low, i_high = percentile_ci(item.samples("accuracy", d), level=item.level)
        c_low, c_high = percentile_ci(clus.samples("accuracy", d), level=clus.level)
        col = []
        for e in evaluation.entries:
            i = item.models.index(e.name)
            col.append(
                f"{point[i]:.3f} {_ci(i_low[i], i_high[i])} {_ci(c_low[i], c_high[i])}"
            )
        data[f"{d} (n={item.n(d)}, clusters={counts[d]})"] = col
    sizes = ", ".join(
        f"{d}: {c.n_clusters} clusters, largest {c.largest}"
        for d, c in analyses.clusters.items()
    )
    return Table(
        pl.DataFrame(data),
        comparable_title(evaluation, "Accuracy: item CI (headline) and cluster CI"),
        f"Each cell: accuracy [item bootstrap 95% CI] [cluster bootstrap 95% CI]. Clusters: "
        f"{CLUSTER_METHOD}; {sizes}. The cluster bootstrap resamples whole clusters "
        f"({clus.n_boot} resamples within each dataset), so near-duplicate items count "
        "once; where it is much wider than the item CI, duplicates inflate the "
        "headline's precision.",
    )


def cluster_paired_table(evaluation: Evaluation, analyses: Analyses) -> Table:
    """Paired difference to the top model: item CI and cluster CI side by side."""
    frame = analyses.paired
    if frame.height == 0:
        return Table(pl.DataFrame({"note": ["no ranked model"]}))
    reference = frame["reference"][0]
    rows = [
        {
            "model": r["model"],
            f"Δ to {reference}": f"{r['difference']:+.3f}",
            "item CI": _ci(r["ci_low"], r["ci_high"]),
            "cluster CI": _ci(r["cluster_ci_low"], r["cluster_ci_high"]),
            "item CI contains 0": "yes" if r["item_ci_has_0"] else "no",
            "cluster CI contains 0": "yes" if r["cluster_ci_has_0"] else "no",
        }
        for r in frame.iter_rows(named=True)
        if r["model"] != reference
    ]
    return Table(
        pl.DataFrame(rows),
        comparable_title(
            evaluation, "Paired difference of mean accuracy to the top model"
        ),
        "Both intervals pair the models on the same resamples; the cluster CI resamples "
        "near-duplicate clusters of test items. A difference whose item CI excludes 0 "
        "but whose cluster CI contains it rests on near-duplicate items.",
    )


def curves_table(evaluation: Evaluation, analyses: Analyses) -> Table:
    """Mean accuracy [95% CI] of every model at each n_train."""
    curves = analyses.curves
    if curves is None or curves.frame.height == 0:
        return Table(pl.DataFrame({"note": ["label-efficiency curves not run"]}))
    frame = curves.frame.filter(pl.col("dataset") == MEAN)
    sizes = sorted(set(frame["n_train"].to_list()))
    data: dict[str, list[str]] = {"model": [e.name for e in evaluation.entries]}
    for n in sizes:
        part = {
            r["model"]: r
            for r in frame.filter(pl.col("n_train") == n).iter_rows(named=True)
        }
        data[f"n_train={n}"] = [
            f"{part[m]['value']:.3f} {_ci(part[m]['ci_low'], part[m]['ci_high'])}"
            if m in part
            else "—"
            for m in data["model"]
        ]
    fits = curves.fits
    reduced = (
        fits.filter(pl.col("n_folds") < evaluation.probe_config.n_folds)
        if fits.height
        else fits
    )
    note = (
        "Train subsets drawn from the version's train items by the protocol's rule "
        "(largest-remainder quotas, seed-hash rank, the version's seed), so they are "
        "nested; the same probe (C grid, CV on log-loss inside train), scored on the "
        "full test set; 95% bootstrap CIs. curves.csv holds every dataset."
    )
    if reduced.height:
        cases = sorted(
            {
                f"{r['dataset']} n_train={r['n_train']}: {r['n_folds']} folds"
                for r in reduced.iter_rows(named=True)
            }
        )
        note += (
            " Fewer folds where a label had under 5 items: " + "; ".join(cases) + "."
        )
    else:
        note += (
            " Every subset had at least 5 items of each label: 5-fold CV throughout."
        )
    return Table(
        pl.DataFrame(data),
        comparable_title(
            evaluation, "Label efficiency: mean accuracy by number of train items"
        ),
        note,
    )


def curves_figure(evaluation: Evaluation, analyses: Analyses) -> Plot:
    """Accuracy vs n_train per model (log axis), one panel per dataset and the mean."""
    curves = analyses.curves
    frame = curves.frame if curves is not None else pl.DataFrame()
    panels = (*evaluation.datasets, MEAN)
    fig = Figure(figsize=(3.6 * len(panels), 3.8))
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    colours = [f"C{i}" for i in range(10)]
    for ax, name in zip(axes, panels, strict=True):
        part = frame.filter(pl.col("dataset") == name) if frame.height else frame
        for j, e in enumerate(evaluation.entries):
            line = part.filter(pl.col("model") == e.name).sort("n_train")
            if line.height == 0:
                continue
            x = line["n_train"].to_numpy()
            style = "--" if e.is_floor else "-"
            colour = "#888888" if e.key is None else colours[j % len(colours)]
            ax.plot(
                x, line["value"], style, marker="o", ms=3, color=colour, label=e.name
            )
            ax.fill_between(
                x, line["ci_low"], line["ci_high"], color=colour, alpha=0.12, lw=0
            )
        ax.set_xscale("log")
        ax.axhline(0.5, color="#cccccc", lw=1, ls=":")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("n_train")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy")
    axes[-1].legend(fontsize=7, loc="lower right")
    fig.suptitle(
        comparable_title(
            evaluation, "Label efficiency: accuracy vs number of train items, 95% CI"
        ),
        fontsize=10,
    )
    fig.tight_layout()
    return Plot(fig, alt="accuracy against n_train per model, one panel per dataset")


def timings_table(analyses: Analyses) -> Table:
    """How long each analysis took in this run."""
    rows = [(name, f"{sec:.1f} s") for name, sec in analyses.seconds.items()]
    return Table(
        pl.DataFrame(rows, schema=["analysis", "time"], orient="row"),
        "Analyses: time taken",
    )


def pretraining_table(evaluation: Evaluation, analyses: Analyses) -> Table:
    """Each random-init twin beside its trained model: the gain with a paired CI."""
    frame = analyses.pretraining
    if frame.height == 0:
        return Table(
            pl.DataFrame({"note": ["no random-init twin in the store"]}),
            comparable_title(evaluation, "Pretraining gain"),
            "Embed a model with --random-init SEED to measure what pretraining adds.",
        )
    rows = []
    for r in frame.iter_rows(named=True):
        rows.append(
            {
                "model": r["model"] or "(trained model not stored)",
                "random-init twin (control)": r["twin"],
                "dataset": r["dataset"],
                "n": r["n"],
                "trained": _value(
                    r["accuracy"] if r["accuracy"] is not None else np.nan
                ),
                "twin": f"{r['twin_accuracy']:.3f}",
                "gain [95% CI]": "—"
                if r["gain"] is None
                else f"{r['gain']:+.3f} {_ci(r['ci_low'], r['ci_high'])}",
            }
        )
    return Table(
        pl.DataFrame(rows),
        comparable_title(
            evaluation, "Pretraining gain: trained model minus its random-init twin"
        ),
        "A twin is the same architecture and embedding options with seeded random "
        "weights drawn as the family initialises them (revision random-init:SEED). "
        "Gain = trained accuracy - twin accuracy, paired bootstrap 95% CI on the "
        "board's resamples. A twin without its trained model is a control alone: what "
        "the architecture reaches with no pretraining.",
    )


def layers_table(evaluation: Evaluation, analyses: Analyses) -> Table:
    """Accuracy per layer and dataset; the layer chosen by CV log-loss is marked."""
    sweeps = analyses.layers
    if sweeps is None or sweeps.frame.height == 0:
        return Table(
            pl.DataFrame({"note": ["no model with several stored layers"]}),
            comparable_title(evaluation, "Layer sweep"),
            "Embed a model with --layers all (or --layers 2,6,12) to compare layers.",
        )
    frame = sweeps.frame
    rows = []
    for (model, layer), part in frame.group_by(["model", "layer"], maintain_order=True):
        row: dict[str, str] = {"model": str(model), "layer": layer_label(int(layer))}
        for d in (*evaluation.datasets, MEAN):
            r = part.filter(pl.col("dataset") == d).row(0, named=True)
            mark = " ★" if r["chosen"] else ""
            row[d] = (
                f"{r['accuracy']:.3f} {_ci(r['ci_low'], r['ci_high'])}; "
                f"CV loss {r['cv_log_loss']:.4f}{mark}"
            )
        rows.append(row)
    picks = sweeps.chosen().filter(pl.col("dataset") == MEAN)
    pick_text = "; ".join(
        f"{r['model']}: layer {layer_label(r['layer'])}"
        for r in picks.iter_rows(named=True)
    )
    return Table(
        pl.DataFrame(rows),
        comparable_title(
            evaluation, "Layer sweep: accuracy [95% CI] and CV log-loss per layer"
        ),
        "Each layer gets the board's probe. ★ marks the layer to pick: the lowest "
        "cross-validated log-loss inside train (per dataset, and in the mean column "
        "the lowest mean over datasets); test accuracy is shown, never used to choose. "
        "Layer 0 is the embedding output, i the output of block i, last (-1) the "
        f"protocol's, the one the board scores. Picks: {pick_text}.",
    )
