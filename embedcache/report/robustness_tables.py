"""Tables of per-item agreement and reverse-complement robustness.

:func:`agreement_tables` shows, per dataset, how often every pair of models
predicts the same label and Cohen's kappa; :func:`always_wrong_table` the test
items every ranked model gets wrong; :func:`rc_table` ``accuracy_rc`` beside
``accuracy`` with the strand cosines (:mod:`embedcache.analysis.rc`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from embedcache.analysis.predictions import agreement, always_wrong
from embedcache.report.parts import Table, comparable_title, fmt_ci

if TYPE_CHECKING:
    from embedcache.analysis.evaluation import Evaluation
    from embedcache.analysis.suite import Analyses

N_SHOWN = 5  # item ids listed per dataset; the rest are in predictions.parquet


def agreement_tables(evaluation: Evaluation) -> list[Table]:
    """One matrix per dataset: cell = share of test items two models agree on, and kappa."""
    names = [e.name for e in evaluation.entries]
    tables = []
    for d in evaluation.datasets:
        pairs = agreement(evaluation, d)
        cell: dict[tuple[str, str], str] = {}
        for row in pairs.iter_rows(named=True):
            kappa = "n/a" if row["kappa"] != row["kappa"] else f"{row['kappa']:.2f}"
            text = f"{row['agreement']:.3f} (κ {kappa})"
            cell[(row["model_a"], row["model_b"])] = text
            cell[(row["model_b"], row["model_a"])] = text
        data: dict[str, list[str]] = {"model": names}
        for b in names:
            data[b] = ["—" if a == b else cell[(a, b)] for a in names]
        n = int(evaluation.labels[d].size)
        tables.append(
            Table(
                pl.DataFrame(data),
                comparable_title(evaluation, f"{d}: agreement between models (n={n})"),
                "Share of test items on which two models predict the same label, and "
                "Cohen's kappa (agreement beyond what each model's label shares give by "
                "chance; n/a when both always say one label). Per-item predictions: "
                "predictions.parquet beside this report.",
            )
        )
    return tables


def always_wrong_table(evaluation: Evaluation) -> Table:
    """Per dataset: the test items every ranked model misclassifies, count and first ids."""
    rows = []
    for d in evaluation.datasets:
        wrong = always_wrong(evaluation, d)
        n = int(evaluation.labels[d].size)
        ids = wrong["item_id"].to_list()
        shown = ", ".join(ids[:N_SHOWN]) + (" …" if len(ids) > N_SHOWN else "")
        rows.append(
            {
                "dataset": d,
                "ranked models": len(evaluation.ranked),
                "n test": n,
                "all wrong": wrong.height,
                "share": f"{wrong.height / n * 100:.1f}%" if n else "-",
                "label 1 among them": int((wrong["label"] == 1).sum()),
                f"first {N_SHOWN} item ids": shown or "-",
            }
        )
    return Table(
        pl.DataFrame(rows),
        comparable_title(evaluation, "Test items every ranked model gets wrong"),
        "Items no ranked model classifies correctly: look at them (item ids are "
        "<dataset>:<split>:<row> in the published file). The full list: rows of "
        "predictions.parquet where correct is false for every ranked model.",
        css_class="embedcache wrap",
    )


def rc_table(evaluation: Evaluation, analyses: Analyses) -> Table:
    """accuracy and accuracy_rc [CI] per model, flagged when the CI excludes accuracy."""
    rc = analyses.rc
    assert rc is not None  # the section shows only with reverse complements
    joined = rc.against_accuracy(evaluation)
    cos = {r["model"]: r for r in rc.cosine.iter_rows(named=True)}
    rows = []
    for r in joined.iter_rows(named=True):
        c = cos.get(r["model"])
        if c is None:  # the majority floor ignores the sequence
            cos_text = p5_text = "— (no vector)"
        elif c["note"]:
            cos_text = p5_text = c["note"]
        else:
            cos_text, p5_text = f"{c['cos_median']:.3f}", f"{c['cos_p5']:.3f}"
        rows.append(
            {
                "model": r["model"],
                "accuracy": f"{r['accuracy']:.3f}",
                "accuracy_rc [95% CI]": f"{r['accuracy_rc']:.3f} "
                + fmt_ci(r["ci_low"], r["ci_high"]),
                "Δ": f"{r['accuracy_rc'] - r['accuracy']:+.3f}",
                "flag": "CI excludes accuracy" if r["excludes_accuracy"] else "",
                "cosine median": cos_text,
                "cosine 5th pct": p5_text,
            }
        )
    missing = (
        f" Not embedded with --with-rc (no accuracy_rc): {', '.join(rc.missing)}."
        if rc.missing
        else ""
    )
    note = (
        "The probe fit on the version's train embeddings, scored on the reverse "
        "complements of the test sequences (mean over datasets; bootstrap as the "
        "board's). Cosine: between a test item's vector and its reverse complement's, "
        "over all test items. A model embedded with --rc average is strand-symmetric "
        "by construction." + missing
    )
    return Table(
        pl.DataFrame(rows),
        comparable_title(evaluation, "Reverse-complement robustness (accuracy_rc)"),
        note,
    )
