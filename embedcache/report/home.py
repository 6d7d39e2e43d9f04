"""The reports home page, ``reports/index.html``: every rendered version, with a link.

One row per ``reports/<version>/`` holding an ``index.html`` and a ``results.csv``:
title (the version's description), subset id, date rendered, number of models
(ranked and floors), the top reproduced model with its mean accuracy and 95% CI,
and the link. Rewritten by every ``embedcache report`` (so ``make report`` and
``make demo`` too). Self-contained: one inline style, nothing fetched, no script.
"""

from __future__ import annotations

import html
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from embedcache.report.parts import NOT_COMPARABLE, atomic_write_text

logger = logging.getLogger(__name__)

HOME_TITLE = "Genomic Benchmarks probe leaderboards"
_STYLE = (
    "<style>body{font-family:sans-serif;color:#222;margin:16px}"
    "table{border-collapse:collapse;font-size:13px}"
    "th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}"
    "th{background:#f0f0f0}.nc{color:#b00}</style>"
)


@dataclass(frozen=True, slots=True)
class VersionSummary:
    """What the home page shows about one rendered version."""

    name: str
    title: str
    comparable: bool
    subset_id: str
    rendered: datetime
    n_models: int
    n_floors: int
    top: str  # "model 0.853 [0.810, 0.887]" or why there is none


def summarize_version(folder: Path) -> VersionSummary:
    """The home page's row for one ``reports/<version>/`` folder."""
    from embedcache.data.versions import load_version
    from embedcache.errors import EmbedcacheError

    results = pl.read_csv(folder / "results.csv")
    try:
        spec = load_version(folder.name)
        title, comparable = spec.description, spec.comparable
    except (EmbedcacheError, OSError):  # a user's own version file, rendered earlier
        title, comparable = folder.name, True
    means = results.filter(
        (pl.col("dataset") == "mean") & (pl.col("metric") == "accuracy")
    )
    models = means.filter(~pl.col("is_floor"))
    # floors only: the board ranks them for demonstration, and so does this page
    pool, floor_note = (models, "") if models.height else (means, " (floor)")
    best = pool.sort("value", descending=True).head(1)
    if best.height:
        r = best.row(0, named=True)
        top = (
            f"{r['model']}{floor_note} {r['value']:.3f} "
            f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]"
        )
    else:
        top = "none"
    mtime = (folder / "index.html").stat().st_mtime
    return VersionSummary(
        name=folder.name,
        title=title,
        comparable=comparable,
        subset_id=str(results["subset_id"][0]) if results.height else "-",
        rendered=datetime.fromtimestamp(mtime, tz=UTC),
        n_models=models.height,
        n_floors=means.height - models.height,
        top=top,
    )


def rendered_versions(output_dir: Path | str) -> list[VersionSummary]:
    """Every version folder under ``output_dir`` with a rendered report, by name."""
    root = Path(output_dir)
    folders = sorted(
        p
        for p in root.glob("*/")
        if (p / "index.html").is_file() and (p / "results.csv").is_file()
    )
    return [summarize_version(p) for p in folders]


def home_html(versions: list[VersionSummary]) -> str:
    """The home page as one HTML document."""
    rows = []
    for v in versions:
        mark = "" if v.comparable else f' <span class="nc">({NOT_COMPARABLE})</span>'
        rows.append(
            "<tr>"
            f'<td><a href="{html.escape(v.name)}/index.html">{html.escape(v.name)}</a>'
            f"{mark}</td>"
            f"<td>{html.escape(v.title)}</td>"
            f"<td><code>{html.escape(v.subset_id)}</code></td>"
            f"<td>{v.rendered:%Y-%m-%d %H:%M} UTC</td>"
            f"<td>{v.n_models} (+{v.n_floors} floors)</td>"
            f"<td>{html.escape(v.top)}</td>"
            "</tr>"
        )
    head = (
        "<tr><th>version</th><th>title</th><th>subset id</th><th>rendered</th>"
        "<th>models</th><th>top reproduced model: mean accuracy [95% CI]</th></tr>"
    )
    body = "".join(rows) or '<tr><td colspan="6">no report rendered yet</td></tr>'
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{HOME_TITLE}</title>{_STYLE}</head><body>"
        f"<h1>{HOME_TITLE}</h1>"
        "<p>Every version rendered here; each report holds its board, per-dataset "
        "values, analyses, results.csv and predictions.parquet. Versions are never "
        "mixed in one ranking.</p>"
        f'<table id="versions"><thead>{head}</thead><tbody>{body}</tbody></table>'
        "</body></html>"
    )


def write_home(output_dir: Path | str) -> Path:
    """Rewrite ``<output_dir>/index.html`` from the reports found there."""
    path = Path(output_dir) / "index.html"
    versions = rendered_versions(output_dir)
    atomic_write_text(path, home_html(versions))
    logger.info("wrote the reports home page %s (%d versions)", path, len(versions))
    return path
