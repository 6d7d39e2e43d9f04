"""Shared by the CLI tests: the command line run as a user runs it, in a new process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_cli(args, **kwargs):
    """``python -m embedcache.cli ARGS`` from the repo root; output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "embedcache.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
        **kwargs,
    )
