"""The rendered report in a real headless Chromium: it loads, shows the table and figures,
and its sections come in order (the board first, provenance last).

Skipped where /usr/bin/chromium is absent (Debian: `apt-get install -y chromium`).
"""

from __future__ import annotations

import nbformat
import numpy as np
import pytest

from embedcache.analysis.leakage import audit_items
from embedcache.report import sections
from embedcache.report.render import notebook_to_html
from scripts.screenshot_report import (
    chromium,
    find_chromium,
    order_problems,
    section_order,
)
from tests.evaluations import tiny_board
from tests.report.test_sections import ORDER

CHROMIUM = find_chromium()

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed")


@pytest.fixture(scope="module")
def report_html(tmp_path_factory):
    """A report built in-process (no kernel): the page the notebook's last cell shows."""
    tmp = tmp_path_factory.mktemp("browser")
    subset, store, ev = tiny_board(tmp, n_boot=200)
    context = sections.ReportContext(
        evaluation=ev,
        subset=subset,
        leakage=audit_items(subset.items),
        parameters={"version": "tiny-v1"},
        store_keys=store.keys(),
    )
    cell = nbformat.v4.new_code_cell("hidden()")
    cell.outputs = [
        nbformat.v4.new_output(
            "display_data", data={"text/html": sections.page(context).text}
        )
    ]
    nb_path = tmp / "report.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), nb_path)
    return notebook_to_html(nb_path, tmp / "index.html", title="tiny-v1 report")


def test_dom_after_load_holds_table_and_figures_in_order(report_html, tmp_path):
    dom = chromium(CHROMIUM, report_html, "--dump-dom", "--virtual-time-budget=3000")
    assert "Leaderboard (accuracy)" in dom
    assert "toy/strong" in dom
    assert dom.count('src="data:image/png;base64,') == 2
    assert "hidden()" not in dom  # input cells are excluded
    assert "<title>tiny-v1 report</title>" in dom
    assert section_order(dom) == ORDER
    assert order_problems(dom) == []
    # collapsed sections keep their tables in the DOM, closed
    # per-dataset, macro-f1, agreement, probes, run and provenance are collapsed; the
    # board rows' per-dataset details carry a class, so are not counted here
    assert dom.count("<details>") == 6
    assert "<details open" not in dom


def test_screenshot_shows_the_board_on_top_then_the_figures(report_html, tmp_path):
    from PIL import Image

    png = tmp_path / "shot.png"
    chromium(
        CHROMIUM,
        report_html,
        f"--screenshot={png}",
        "--window-size=1200,2600",
    )
    img = np.asarray(Image.open(png).convert("RGB")).astype(int)
    assert img.shape[:2] == (2600, 1200)
    dark = (img.sum(axis=2) < 200).mean()
    assert dark > 0.002  # text and axes were drawn

    def first_row(mask, min_pixels=50):
        rows = np.flatnonzero(mask.sum(axis=1) >= min_pixels)
        return int(rows[0]) if rows.size else None

    # the red warning (this version is not comparable) right under the title
    red = (img[..., 0] > 150) & (img[..., 1] < 40) & (img[..., 2] < 40)
    assert red.sum() > 50
    assert first_row(red, 5) < 200
    # the board's header row (#f0f0f0) is the first table on the page, near the top
    header = (np.abs(img - 240).sum(axis=2) == 0) & (img.sum(axis=2) == 720)
    board = first_row(header, 150)
    assert board is not None
    assert board < 400
    # matplotlib's default blue (#1f77b4) marks the models in the figures, further down
    blue = np.abs(img - np.array([0x1F, 0x77, 0xB4])).sum(axis=2) < 30
    assert blue.sum() > 50
    assert first_row(blue, 3) > board + 200
