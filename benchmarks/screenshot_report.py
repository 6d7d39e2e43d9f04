"""Load a rendered report in headless Chromium: screenshot it and check the DOM.

Run: .venv/bin/python benchmarks/screenshot_report.py reports/demo-v1/index.html [out.png]

Prints the load time, whether the leaderboard table and the figures are in the DOM
Chromium built, and where the PNG went. Exits 0 with a message where Chromium is absent
(Debian: `apt-get install -y chromium`).
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
    return 0 if tables and images else 1


if __name__ == "__main__":
    sys.exit(main())
