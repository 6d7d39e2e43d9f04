"""The report's layout: title, a one-line summary, the leaderboard, then the details.

A report is an ordered list of sections. Each is one function
``section(context: ReportContext) -> Section | None`` (``None``: nothing to show for
this version) that builds its parts with :mod:`embedcache.report.tables`,
:mod:`~embedcache.report.figures` and :mod:`~embedcache.report.provenance`.
:data:`SECTIONS` lists them in page order; :func:`header` writes the title, the table
of contents (one anchor per section shown) and the summary line. To add a section,
write such a function and insert it into :data:`SECTIONS` (or pass your own list to
:func:`build_sections`): the contents and the page follow.

Order, as a reader of a paper wants it: the board first; per-dataset values and
macro F1 one click away (collapsed ``<details>``); floors, figures, leakage and
caveats; run parameters, store keys and provenance last.
"""

from __future__ import annotations

import html
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from embedcache import __version__
from embedcache.analysis.bootstrap import MEAN
from embedcache.report.analysis_tables import (
    clean_dataset_table,
    clean_table,
    cluster_paired_table,
    cluster_table,
    curves_figure,
    curves_table,
    full_train_table,
    layers_table,
    leakage_audit_table,
    pretraining_table,
    timings_table,
)
from embedcache.report.figures import accuracy_figure, paired_difference_figure
from embedcache.report.parts import NOT_COMPARABLE, Html, Plot, Table
from embedcache.report.provenance import (
    model_keys_table,
    provenance_table,
    run_table,
    store_keys_table,
)
from embedcache.report.published import PublishedSource, published_for
from embedcache.report.robustness_tables import (
    agreement_tables,
    always_wrong_table,
    rc_table,
)
from embedcache.report.tables import (
    caveats,
    dataset_table,
    floors_table,
    leaderboard_table,
    leakage_table,
    probe_table,
    published_table,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    import polars as pl

    from embedcache.analysis.evaluation import Evaluation
    from embedcache.analysis.suite import Analyses
    from embedcache.data.subsets import Subset
    from embedcache.report.overlap import Declaration

    Part = Table | Plot | Html

logger = logging.getLogger(__name__)

TITLE = "Genomic Benchmarks probe leaderboard"
# Page-wide styles: one inline block, nothing fetched.
_STYLE = """<style>
.ec-report{font-family:sans-serif;color:#222}
.ec-report h1{font-size:22px;margin:8px 0 2px 0}
.ec-toc{font-size:12px;color:#555;margin:2px 0 6px 0}
.ec-toc a{color:#1f5fa8;text-decoration:none;margin-right:10px}
.ec-summary{font-size:14px;margin:6px 0 4px 0}
.ec-warning{color:#b00;font-weight:bold;font-size:15px;margin:4px 0}
section.ec-section{margin:14px 0 10px 0;font-family:sans-serif}
section.ec-section h2{font-size:17px;margin:6px 0}
section.ec-section details>summary{cursor:pointer}
section.ec-section details>summary h2{display:inline}
section.ec-section td{white-space:nowrap}
section.ec-section table.wrap td{white-space:normal}
table.published td{color:#555;font-style:italic}
</style>"""


@dataclass(frozen=True)
class ReportContext:
    """Everything a section may show; sections read it and build their parts."""

    evaluation: Evaluation
    subset: Subset
    leakage: pl.DataFrame | None = None
    parameters: Mapping[str, Any] = field(default_factory=dict)
    store_keys: Sequence[Any] = ()
    # None: the package's published results for this version (often none)
    published: tuple[PublishedSource, ...] | None = None
    # one timestamp for the summary line and the provenance
    created: datetime = field(default_factory=lambda: datetime.now(UTC))
    # leakage-clean accuracy, clusters, curves, pretraining gain, layer sweep
    analyses: Analyses | None = None
    # a user's overlap declarations (`embedcache report --overlap FILE`), by model
    declared: Mapping[str, Declaration] = field(default_factory=dict)

    def published_sources(self) -> tuple[PublishedSource, ...]:
        """The published sources shown beside this version (only its own)."""
        return published_for(self.subset.version, sources=self.published)


@dataclass(frozen=True)
class Section:
    """One part of the page: an anchor for the contents, a title, tables and figures.

    ``collapsed`` puts the parts in a closed ``<details>``; ``heading=False`` shows no
    title (the leaderboard, whose table caption says what it is).
    """

    anchor: str
    title: str
    parts: tuple[Part, ...]
    collapsed: bool = False
    heading: bool = True

    def to_html(self) -> str:
        body = "".join(part.to_html() for part in self.parts)
        title = f"<h2>{html.escape(self.title)}</h2>"
        if self.collapsed:
            body = f"<details><summary>{title}</summary>{body}</details>"
        elif self.heading:
            body = title + body
        return (
            f'<section class="ec-section" id="{html.escape(self.anchor)}">'
            f"{body}</section>"
        )

    def _repr_html_(self) -> str:
        return self.to_html()


def leaderboard_section(context: ReportContext) -> Section:
    """The board: rank, model, value, 95% CI, n, ≠, Δ to the best [paired CI]."""
    return Section(
        "leaderboard",
        "Leaderboard",
        (leaderboard_table(context.evaluation, declared=context.declared),),
        heading=False,
    )


def published_section(context: ReportContext) -> Section | None:
    """Published numbers for this version only, as context rows: never ranked."""
    sources = context.published_sources()
    if not sources:
        return None
    datasets = context.evaluation.datasets
    return Section(
        "published",
        "Published results (context, not ranked)",
        tuple(
            published_table(source, datasets, declared=context.declared)
            for source in sources
        ),
    )


def per_dataset_section(context: ReportContext) -> Section:
    return Section(
        "per-dataset",
        "Accuracy per dataset",
        (dataset_table(context.evaluation),),
        collapsed=True,
    )


def macro_f1_section(context: ReportContext) -> Section:
    ev = context.evaluation
    return Section(
        "macro-f1",
        "Macro F1",
        (
            leaderboard_table(ev, metric="macro_f1", declared=context.declared),
            dataset_table(ev, metric="macro_f1"),
        ),
        collapsed=True,
    )


def floors_section(context: ReportContext) -> Section:
    return Section("floors", "Floors", (floors_table(context.evaluation),))


def figures_section(context: ReportContext) -> Section:
    ev = context.evaluation
    return Section(
        "figures",
        "Figures",
        (accuracy_figure(ev), paired_difference_figure(ev)),
    )


def agreement_section(context: ReportContext) -> Section:
    """Pairwise agreement per dataset and the items every ranked model gets wrong."""
    ev = context.evaluation
    return Section(
        "agreement",
        "Agreement between models and items all get wrong",
        (always_wrong_table(ev), *agreement_tables(ev)),
        collapsed=True,
    )


def rc_section(context: ReportContext) -> Section | None:
    """accuracy_rc beside accuracy, for the models whose reverse complements are stored."""
    return _analysis_section(
        context,
        "rc-robustness",
        "Reverse-complement robustness",
        (rc_table,),
        shown=lambda a: a.rc is not None and a.rc.bootstrap is not None,
    )


def leakage_section(context: ReportContext) -> Section | None:
    a = context.analyses
    if a is not None:  # the audit with containment, and the full-train context
        return Section(
            "leakage",
            "Leakage",
            (
                leakage_audit_table(a),
                full_train_table(a),
            ),
        )
    if context.leakage is None:
        return None
    return Section("leakage", "Leakage", (leakage_table(context.leakage),))


def _analysis_section(
    context: ReportContext,
    anchor: str,
    title: str,
    parts: Sequence[Callable[[Evaluation, Analyses], Part]],
    *,
    shown: Callable[[Analyses], bool] = lambda _: True,
    collapsed: bool = False,
) -> Section | None:
    """A section of analysis parts, each ``part(evaluation, analyses)``.

    None when the report has no analyses, or ``shown(analyses)`` says there is
    nothing to show for this version.
    """
    a, ev = context.analyses, context.evaluation
    if a is None or not shown(a):
        return None
    return Section(anchor, title, tuple(p(ev, a) for p in parts), collapsed=collapsed)


def clean_section(context: ReportContext) -> Section | None:
    """Accuracy on the test items with no duplicate in the drawn train, and rank changes."""
    tables = (clean_table, clean_dataset_table)
    return _analysis_section(context, "clean", "Leakage-clean accuracy", tables)


def clusters_section(context: ReportContext) -> Section | None:
    """The cluster bootstrap beside the item bootstrap, for scores and differences."""
    tables = (cluster_table, cluster_paired_table)
    title = "Cluster-aware intervals"
    return _analysis_section(context, "clusters", title, tables, collapsed=True)


def curves_section(context: ReportContext) -> Section | None:
    return _analysis_section(
        context,
        "label-efficiency",
        "Label efficiency",
        (curves_figure, curves_table),
        shown=lambda a: a.curves is not None,
    )


def pretraining_section(context: ReportContext) -> Section | None:
    return _analysis_section(
        context,
        "pretraining",
        "Pretraining gain",
        (pretraining_table,),
        shown=lambda a: a.pretraining.height != 0,
    )


def layers_section(context: ReportContext) -> Section | None:
    return _analysis_section(
        context,
        "layers",
        "Layer sweep",
        (layers_table,),
        shown=lambda a: a.layers is not None and a.layers.frame.height != 0,
    )


def caveats_section(context: ReportContext) -> Section:
    return Section(
        "caveats", "Caveats", (caveats(context.evaluation, context.leakage),)
    )


def probes_section(context: ReportContext) -> Section:
    ev = context.evaluation
    return Section("probes", "Probe fits", (probe_table(ev),), collapsed=True)


def run_section(context: ReportContext) -> Section:
    parts: tuple[Part, ...] = (
        run_table(context.parameters),
        store_keys_table(context.store_keys),
    )
    if context.analyses is not None:
        parts += (timings_table(context.analyses),)
    return Section("run", "Run parameters and store keys", parts, collapsed=True)


def provenance_section(context: ReportContext) -> Section:
    ev = context.evaluation
    return Section(
        "provenance",
        "Provenance",
        (
            provenance_table(ev, context.subset, created=context.created),
            model_keys_table(ev),
        ),
        collapsed=True,
    )


SECTIONS: tuple[Callable[[ReportContext], Section | None], ...] = (
    leaderboard_section,
    published_section,
    per_dataset_section,
    macro_f1_section,
    floors_section,
    figures_section,
    agreement_section,
    rc_section,
    clean_section,
    clusters_section,
    leakage_section,
    curves_section,
    pretraining_section,
    layers_section,
    caveats_section,
    probes_section,
    run_section,
    provenance_section,
)


def build_sections(
    context: ReportContext,
    sections: Sequence[Callable[[ReportContext], Section | None]] = SECTIONS,
) -> list[Section]:
    """Every section with something to show, in order; anchors must be unique."""
    built = [s for s in (fn(context) for fn in sections) if s is not None]
    anchors = [s.anchor for s in built]
    if len(set(anchors)) != len(anchors):
        msg = f"two report sections share an anchor: {anchors}"
        raise ValueError(msg)
    return built


def summary_line(context: ReportContext) -> str:
    """version · n test items over k datasets · subset id · date (plain text)."""
    ev = context.evaluation
    n = ev.bootstrap.n(MEAN)
    k = len(ev.datasets)
    when = context.created.strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"{ev.version} · n = {n:,} test items over {k} datasets · subset "
        f"{ev.subset_id} · {when} · embedcache {__version__}"
    )


def header(context: ReportContext, sections: Sequence[Section]) -> Html:
    """Title, the non-comparable warning where due, contents, and the summary line."""
    ev = context.evaluation
    title = f"<h1>{html.escape(TITLE)}: {html.escape(ev.version)}</h1>"
    warning = (
        ""
        if ev.comparable
        else (
            f'<p class="ec-warning" style="color:#b00;font-weight:bold">'
            f"{html.escape(ev.version)} is {NOT_COMPARABLE}: its results must "
            "never be shown beside or mixed with a leaderboard version's.</p>"
        )
    )
    links = "".join(
        f'<a href="#{html.escape(s.anchor)}">{html.escape(s.title)}</a>'
        for s in sections
    )
    toc = f'<nav class="ec-toc">Contents: {links}</nav>'
    summary = f'<p class="ec-summary">{html.escape(summary_line(context))}</p>'
    return Html(f'{_STYLE}<div class="ec-report">{title}{warning}{toc}{summary}</div>')


def page(
    context: ReportContext,
    sections: Sequence[Callable[[ReportContext], Section | None]] = SECTIONS,
) -> Html:
    """The whole report as one HTML fragment: header, then every section."""
    built = build_sections(context, sections)
    return Html(header(context, built).text + "".join(s.to_html() for s in built))
