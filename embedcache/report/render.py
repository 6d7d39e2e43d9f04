"""Render a report: jupytext ``.py`` -> ``.ipynb`` -> papermill -> one HTML file.

The HTML is self-contained: code cells hidden, figures embedded as base64 PNG, and
the template's CDN scripts (require.js, MathJax, mermaid, widgets) left out, so the
file opens offline and loads nothing from the network.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
import jupytext
import nbformat
import papermill
from nbconvert import HTMLExporter

from embedcache.errors import EmbedcacheError
from embedcache.report.parts import atomic_write_text

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

logger = logging.getLogger(__name__)

# an installed wheel carries the notebooks here (pyproject's force-include); a source
# checkout runs them from notebooks/ beside the package, where they are edited
NOTEBOOKS_DIRS = (
    Path(__file__).resolve().parent / "notebooks",
    Path(__file__).resolve().parents[2] / "notebooks",
)
KERNEL = "python3"
# The lab template minus every block that pulls a script from a CDN.
_OFFLINE_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block data_png scoped -%}
<div class="jp-RenderedImage jp-OutputArea-output {{ extra_class }}">
<img src="data:image/png;base64,{{ output.data['image/png'] | escape_html }}"
 alt="{{ ((output | get_metadata('alt', 'image/png')) or 'figure') | escape_html }}">
</div>
{%- endblock data_png -%}
"""


class ReportError(EmbedcacheError, RuntimeError):
    """A report notebook failed to execute or convert."""


@dataclass(frozen=True, slots=True)
class ReportPaths:
    """Where one rendered report landed."""

    notebook: Path
    html: Path
    results: Path


def notebook_source(name: str = "leaderboard") -> Path:
    """The jupytext source of a shipped notebook (``notebooks/<name>.py``)."""
    for folder in NOTEBOOKS_DIRS:
        path = folder / f"{name}.py"
        if path.exists():
            return path
    msg = (
        f"notebook {name}.py is in none of {', '.join(map(str, NOTEBOOKS_DIRS))}; "
        "install embedcache from its wheel, or run from a source checkout"
    )
    raise ReportError(msg)


def execute_notebook(
    source: Path,
    output: Path,
    *,
    parameters: Mapping[str, Any],
    cwd: Path | None = None,
    kernel_name: str = KERNEL,
) -> Path:
    """Convert a jupytext ``.py`` to a notebook and execute it with papermill.

    Raises
    ------
    ReportError
        A cell failed; the message names it (papermill's error, with the
        partly executed notebook kept at ``output`` for inspection).
    """
    nb = jupytext.read(source)
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        unexecuted = Path(tmp) / f"{source.stem}.ipynb"
        nbformat.write(nb, unexecuted)
        try:
            papermill.execute_notebook(
                str(unexecuted),
                str(output),
                parameters=dict(parameters),
                kernel_name=kernel_name,
                progress_bar=False,
                cwd=str(cwd) if cwd else None,
            )
        except papermill.PapermillExecutionError as err:
            msg = (
                f"notebook {source.name} failed in cell {err.cell_index} with "
                f"{err.ename}: {err.evalue}. The partly executed notebook is at {output}."
            )
            raise ReportError(msg) from err
    logger.info("executed %s -> %s", source, output)
    return output


def notebook_to_html(notebook: Path, output: Path, *, title: str | None = None) -> Path:
    """Write one self-contained HTML file: no input cells, no prompts, no CDN scripts.

    ``title`` becomes the page's ``<title>`` (default: the notebook's file name).
    """
    exporter = HTMLExporter(
        template_name="lab",
        extra_loaders=[
            jinja2.DictLoader({"embedcache_offline.html.j2": _OFFLINE_TEMPLATE})
        ],
        template_file="embedcache_offline.html.j2",
        exclude_input=True,
        exclude_input_prompt=True,
        exclude_output_prompt=True,
    )
    nb = nbformat.read(notebook, as_version=4)
    if title:
        nb.metadata["title"] = title
    body, _ = exporter.from_notebook_node(nb)
    atomic_write_text(output, body)
    logger.info("rendered %s (%d bytes)", output, len(body))
    return output


def render_report(
    version: str,
    *,
    store: Path | str,
    data_dir: Path | str | None = None,
    models: Sequence[str] = (),
    output_dir: Path | str = "reports",
    n_boot: int = 1000,
    seed: int = 0,
    kernel_name: str = KERNEL,
    source: Path | None = None,
    overlap: Path | str | None = None,
) -> ReportPaths:
    """Execute the leaderboard notebook for ``version`` and render it.

    Writes ``<output_dir>/<name>/leaderboard.ipynb``, ``index.html``,
    ``results.csv``, ``curves.csv`` and ``predictions.parquet``, where ``<name>`` is
    the version's name (a version file's stem), then rewrites the reports home page
    ``<output_dir>/index.html``. ``overlap``: a TOML declaring models' pretraining
    corpora (:mod:`embedcache.report.overlap`).
    """
    from embedcache.data.versions import load_version
    from embedcache.report.home import write_home
    from embedcache.report.overlap import read_declarations
    from embedcache.store import EmbeddingStore, is_url

    # Fail before the slow kernel start on a wrong version, store path or overlap file.
    load_version(version)
    EmbeddingStore(store, create=False)
    if overlap is not None:
        read_declarations(overlap)
    name = Path(version).stem if str(version).endswith(".toml") else str(version)
    out = Path(output_dir) / name
    paths = ReportPaths(
        out / "leaderboard.ipynb", out / "index.html", out / "results.csv"
    )
    parameters = {
        "version": str(Path(version).resolve())
        if str(version).endswith(".toml")
        else version,
        "store": str(store) if is_url(store) else str(Path(store).resolve()),
        "models": list(models),
        "data_dir": str(Path(data_dir).resolve()) if data_dir else None,
        "n_boot": int(n_boot),
        "seed": int(seed),
        "results_csv": str(paths.results.resolve()),
        "overlap": str(Path(overlap).resolve()) if overlap is not None else None,
    }
    execute_notebook(
        source or notebook_source("leaderboard"),
        paths.notebook,
        parameters=parameters,
        kernel_name=kernel_name,
    )
    notebook_to_html(
        paths.notebook,
        paths.html,
        title=f"{name}: Genomic Benchmarks probe leaderboard",
    )
    write_home(output_dir)
    return paths


def summarize_report(version: str | Path, paths: ReportPaths) -> str:
    """What ``embedcache report`` prints: each model's mean accuracy with its 95% CI
    and n, best first, from the written ``results.csv``, then where the files are."""
    import polars as pl

    from embedcache.data.versions import load_version

    spec = load_version(version)
    results = pl.read_csv(paths.results)
    means = results.filter(
        (pl.col("dataset") == "mean") & (pl.col("metric") == "accuracy")
    ).sort("value", descending=True)
    label = "" if spec.comparable else " (not comparable to the leaderboard)"
    lines = [f"{spec.name}{label}: mean accuracy [95% CI], n"]
    for row in means.iter_rows(named=True):
        floor = " (floor)" if row["is_floor"] else ""
        lines.append(
            f"  {row['model']:<40} {row['value']:.3f} "
            f"[{row['ci_low']:.3f}, {row['ci_high']:.3f}] n={row['n']}{floor}"
        )
    lines += [
        f"notebook: {paths.notebook}",
        f"results:  {paths.results}",
        f"report:   {paths.html}",
    ]
    return "\n".join(lines)
