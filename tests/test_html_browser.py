"""The rendered report in a real headless Chromium: it loads, shows the table and figures.

Skipped where /usr/bin/chromium is absent (Debian: `apt-get install -y chromium`).
"""

from __future__ import annotations

import base64

import nbformat
import numpy as np
import pytest

from benchmarks.screenshot_report import chromium, find_chromium
from embedcache import leaderboard, report
from embedcache.render import notebook_to_html
from embedcache.subsets import draw_version
from embedcache.versions import load_version
from tests.test_report import TINY_VERSION, DictStore, _fill

CHROMIUM = find_chromium()

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed")


def _output(obj):
    if isinstance(obj, report.Plot):
        png, meta = obj._repr_png_()
        return nbformat.v4.new_output(
            "display_data",
            data={"image/png": base64.b64encode(png).decode("ascii")},
            metadata={"image/png": meta},
        )
    return nbformat.v4.new_output("display_data", data={"text/html": obj._repr_html_()})


@pytest.fixture(scope="module")
def report_html(tmp_path_factory):
    """A report built in-process (no kernel): the same objects the notebook shows."""
    tmp = tmp_path_factory.mktemp("browser")
    version = tmp / "tiny-v1.toml"
    version.write_text(TINY_VERSION)
    subset = draw_version(load_version(version))
    store = DictStore()
    _fill(store, subset.items)
    ev = leaderboard.evaluate(subset, store, n_boot=200)
    shown = [
        report.banner(ev),
        report.leaderboard_table(ev),
        report.accuracy_figure(ev),
        report.paired_difference_figure(ev),
        report.caveats(ev),
    ]
    cells = []
    for obj in shown:
        cell = nbformat.v4.new_code_cell("hidden()")
        cell.outputs = [_output(obj)]
        cells.append(cell)
    nb_path = tmp / "report.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=cells), nb_path)
    return notebook_to_html(nb_path, tmp / "index.html")


def test_dom_after_load_holds_table_and_figures(report_html, tmp_path):
    dom = chromium(CHROMIUM, report_html, "--dump-dom", "--virtual-time-budget=3000")
    assert "Leaderboard (accuracy)" in dom
    assert "toy/strong" in dom
    assert dom.count('src="data:image/png;base64,') == 2
    assert "hidden()" not in dom  # input cells are excluded


def test_screenshot_shows_text_and_plot_markers(report_html, tmp_path):
    from PIL import Image

    png = tmp_path / "shot.png"
    chromium(
        CHROMIUM,
        report_html,
        f"--screenshot={png}",
        "--window-size=1200,1800",
    )
    img = np.asarray(Image.open(png).convert("RGB")).astype(int)
    assert img.shape[:2] == (1800, 1200)
    dark = (img.sum(axis=2) < 200).mean()
    assert dark > 0.002  # text and axes were drawn
    # matplotlib's default blue (#1f77b4) marks the models in the accuracy figure
    blue = (np.abs(img - np.array([0x1F, 0x77, 0xB4])).sum(axis=2) < 30).sum()
    assert blue > 50
    # the banner's red warning: this version is not comparable
    red = ((img[..., 0] > 150) & (img[..., 1] < 40) & (img[..., 2] < 40)).sum()
    assert red > 50
