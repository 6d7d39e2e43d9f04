"""Load a rendered report in headless Chromium: screenshot it and check the DOM.

Run: .venv/bin/python scripts/screenshot_report.py reports/demo-v1/index.html [out.png]

Prints the load time, whether the leaderboard table and the figures are in the DOM
Chromium built, the order of the report's sections (the board first, run parameters
and provenance last, as the contents list them), and where the PNG went. Exits 0 with
a message where Chromium is absent (Debian: `apt-get install -y chromium`).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
)


def find_chromium() -> str | None:
    for name in ("/usr/bin/chromium", "chromium", "chromium-browser"):
        path = shutil.which(name) if not name.startswith("/") else name
        if path and Path(path).exists():
            return path
    return None


def chromium(binary: str, html: Path, *args: str, timeout: float = 120) -> str:
    """Run Chromium once on ``html`` with a fresh profile; return stdout."""
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        out = subprocess.run(
            [
                binary,
                *FLAGS,
                f"--user-data-dir={profile}",
                *args,
                html.resolve().as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )
    return out.stdout


LAST_SECTIONS = ("run", "provenance")


def section_order(dom: str) -> list[str]:
    """The ids of the report's sections, in page order."""
    return re.findall(r'<section class="ec-section" id="([^"]+)"', dom)


def order_problems(dom: str) -> list[str]:
    """What is out of place: the title, summary and board must come first, the
    sections in the order the contents list them, run and provenance last."""
    problems = []
    ids = section_order(dom)
    nav = re.search(r'<nav class="ec-toc">(.*?)</nav>', dom, flags=re.DOTALL)
    toc = re.findall(r'href="#([^"]+)"', nav.group(1)) if nav else []
    if not ids or ids[0] != "leaderboard":
        problems.append(f"the first section is not the leaderboard: {ids[:1]}")
    if toc != ids:
        problems.append(f"contents {toc} differ from the sections {ids}")
    if tuple(ids[-len(LAST_SECTIONS) :]) != LAST_SECTIONS:
        problems.append(f"{LAST_SECTIONS} are not last: {ids}")
    marks = [
        dom.find("<h1"),
        dom.find('class="ec-summary"'),
        dom.find('<section class="ec-section" id="leaderboard"'),
    ]
    if -1 in marks or marks != sorted(marks):
        problems.append("title, summary line and leaderboard are not the first three")
    elif "<table" in dom[: marks[2]] or "<img" in dom[: marks[2]]:
        problems.append("a table or figure comes before the leaderboard")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("html", type=Path)
    parser.add_argument(
        "png", type=Path, nargs="?", default=Path("report-screenshot.png")
    )
    parser.add_argument("--height", type=int, default=3000)
    args = parser.parse_args()
    binary = find_chromium()
    if binary is None:
        print("chromium not found: skipped (apt-get install -y chromium)")
        return 0
    t0 = time.perf_counter()
    dom = chromium(binary, args.html, "--dump-dom", "--virtual-time-budget=5000")
    t_dom = time.perf_counter() - t0
    tables = len(re.findall(r"<table", dom))
    images = len(re.findall(r'<img[^>]+src="data:image/png;base64,', dom))
    print(
        f"DOM after load: {tables} tables, {images} embedded PNG figures ({t_dom:.1f} s)"
    )
    print(f"leaderboard table present: {'Leaderboard (accuracy)' in dom}")
    print(f"sections in order: {', '.join(section_order(dom))}")
    problems = order_problems(dom)
    for problem in problems:
        print(f"ORDER: {problem}")
    t0 = time.perf_counter()
    chromium(
        binary,
        args.html,
        f"--screenshot={args.png.resolve()}",
        f"--window-size=1400,{args.height}",
    )
    print(
        f"screenshot {args.png} ({args.png.stat().st_size:,} bytes, {time.perf_counter() - t0:.1f} s)"
    )
    return 0 if tables and images and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
