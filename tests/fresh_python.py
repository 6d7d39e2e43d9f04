"""Run a snippet in a fresh interpreter on this checkout: what a process imports, or
sets process-wide, is then the snippet's alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def fresh_python(code: str, *args: str) -> str:
    """The snippet's stdout, stripped; a failing snippet fails the test."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return done.stdout.strip()
