"""The documentation site as a reader meets it: built by mkdocs, served on 127.0.0.1 and
opened in Debian's Chromium through Playwright.

The home page shows the board's screenshot, the settings reference lists every setting,
the models catalogue every family, the benchmarks page renders its plot, and a crawl
from the home page finds no internal link, image, stylesheet or script that 404s.

Skipped where no chromium binary exists (Debian: ``apt-get install -y chromium``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urldefrag, urljoin

import pytest

from embedcache.models.registry import FAMILY_MODULES, family_module
from embedcache.service.settings import ServeSettings, env_name
from scripts.screenshot_report import FLAGS, find_chromium

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = find_chromium()

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed")

# what a served page can load: a broken one shows as a request failure or a 4xx/5xx
_RESOURCES = "a[href], img[src], link[href], script[src]"


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built from this checkout with ``--strict``, as ``make docs`` builds it."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def base_url(site):
    handler = functools.partial(_Quiet, directory=str(site))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=list(FLAGS))
        try:
            yield browser
        finally:
            browser.close()


@contextlib.contextmanager
def opened(browser, url: str):
    """A page loaded at ``url``, with every failed or 4xx/5xx request it made listed."""
    page = browser.new_page()
    failed = watch(page)
    load(page, url)
    try:
        yield page, failed
    finally:
        page.close()


def watch(page) -> list[str]:
    """The requests of ``page`` that fail or answer 4xx/5xx, as they happen."""
    failed: list[str] = []

    def request_failed(request) -> None:
        # a request still in flight when the crawl moves on is aborted, not broken
        if request.failure != "net::ERR_ABORTED":
            failed.append(f"{request.url} {request.failure}")

    page.on("requestfailed", request_failed)
    page.on(
        "response",
        lambda r: r.status >= 400 and failed.append(f"{r.url} {r.status}"),
    )
    return failed


def load(page, url: str) -> None:
    response = page.goto(url, wait_until="load")
    assert response is not None
    assert response.status == 200, url


def images_rendered(page) -> list[tuple[str, int]]:
    """Each image of the page's article with its rendered width (0: did not render)."""
    return page.eval_on_selector_all(
        "article img", "els => els.map(e => [e.src, e.complete ? e.naturalWidth : 0])"
    )


def table_text(page) -> str:
    return " ".join(page.locator("article table").all_inner_texts())


def test_home_page_shows_the_board_and_its_links(browser, base_url):
    with opened(browser, base_url + "index.html") as (page, failed):
        assert "embedcache" in page.title()
        assert page.locator("article h1").inner_text().startswith("embedcache")
        images = images_rendered(page)
        assert any(src.endswith("assets/board.png") and w > 0 for src, w in images)
        assert page.locator("nav a", has_text="Settings reference").count() >= 1
        assert failed == []


def test_settings_reference_lists_every_setting_once(browser, base_url):
    with opened(browser, base_url + "serve/settings.html") as (page, failed):
        rows = page.locator("article table").first.locator("tbody tr").all_inner_texts()
        names = [row.split()[0] for row in rows]
        assert sorted(names) == sorted(ServeSettings.model_fields)
        text = table_text(page)
        for name in ServeSettings.model_fields:
            assert "--" + name.replace("_", "-") in text
            assert env_name(name) in text
        assert failed == []


def test_models_catalogue_has_a_row_per_family(browser, base_url):
    with opened(browser, base_url + "models/index.html") as (page, failed):
        rows = page.locator("article table").first.locator("tbody tr").all_inner_texts()
        families = [row.split("\t")[0].strip() for row in rows]
        assert families == [family_module(name).FAMILY for name in FAMILY_MODULES]
        assert "kuleshov-group/caduceus-ph" in table_text(page)
        assert failed == []


def test_benchmarks_page_renders_its_plot(browser, base_url):
    with opened(browser, base_url + "benchmarks.html") as (page, failed):
        images = images_rendered(page)
        plots = images + page.eval_on_selector_all(
            "article svg",
            "els => els.map(e => [e.id, e.getBoundingClientRect().width])",
        )
        assert plots, "no plot on the benchmarks page"
        assert all(width > 0 for _, width in plots), plots
        assert failed == []


def test_no_internal_link_is_broken(browser, base_url):
    """Crawl every page reachable from the home page, in one tab; fetch every other
    resource a page links (images, stylesheets, scripts) once."""
    page = browser.new_page()
    failed = watch(page)
    queue, seen = [base_url + "index.html"], set()
    broken, unrendered = [], []
    while queue:
        url = queue.pop()
        if url in seen:
            continue
        seen.add(url)
        failed.clear()
        load(page, url)
        broken += [f"{f} (from {url})" for f in failed]
        unrendered += [src for src, width in images_rendered(page) if width == 0]
        links = page.eval_on_selector_all(
            _RESOURCES, "els => els.map(e => e.getAttribute('href') || e.src)"
        )
        for link in links:
            target = urldefrag(urljoin(url, link)).url
            if not target.startswith(base_url):
                continue  # another site: not ours to check
            if target.endswith((".html", "/")):
                queue.append(target)
            elif target not in seen:
                seen.add(target)
                status = page.request.get(target).status
                if status >= 400:
                    broken.append(f"{target} {status} (from {url})")
    page.close()
    assert broken == []
    assert unrendered == []
    assert len([u for u in seen if u.endswith(".html")]) >= 30
