"""What a report shows, as objects a notebook cell displays: Table, Plot and Html.

A :class:`Table` is a polars frame plus caption, a :class:`Plot` a matplotlib Figure:
both render themselves in a notebook (``_repr_html_`` / ``_repr_png_``) and as HTML
(``to_html``), so a notebook cell is one call. Also the small formatting rules every
table shares (numbers, intervals, the non-comparability label).
"""

from __future__ import annotations

import base64
import html
import io
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl
    from matplotlib.figure import Figure

    from embedcache.analysis.evaluation import Evaluation

NOT_COMPARABLE = "not comparable to the leaderboard"
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
    raw_columns: tuple[str, ...] = ()  # columns whose cells are HTML already

    def to_html(self) -> str:
        head = "".join(
            f'<th style="{_CELL_CSS};background:#f0f0f0">{html.escape(c)}</th>'
            for c in self.frame.columns
        )
        raw = [c in self.raw_columns for c in self.frame.columns]
        body = "".join(
            "<tr>"
            + "".join(
                f'<td style="{_CELL_CSS}">'
                f"{_cell(v) if is_raw else html.escape(_cell(v))}</td>"
                for v, is_raw in zip(row, raw, strict=True)
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


def fmt_ci(low: float, high: float) -> str:
    return f"[{low:.3f}, {high:.3f}]"


def comparable_title(evaluation: Evaluation, text: str) -> str:
    """Append the non-comparability label where the version asks for it."""
    if evaluation.comparable:
        return text
    return f"{text} ({evaluation.version}: {NOT_COMPARABLE})"


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically: a reader sees the old file or the new."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        Path(tmp).replace(path)
    finally:
        Path(tmp).unlink(missing_ok=True)
