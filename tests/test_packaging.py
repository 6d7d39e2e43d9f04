"""Every data file the package reads ships with it (the layout moves files around)."""

from __future__ import annotations

import tomllib
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "embedcache"


def test_every_data_file_in_the_package_is_declared_as_package_data():
    with (ROOT / "pyproject.toml").open("rb") as fh:
        patterns = tomllib.load(fh)["tool"]["setuptools"]["package-data"]["embedcache"]
    tracked = [
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file()
        and path.suffix not in {".py", ".pyc"}
        and "__pycache__" not in path.parts
    ]
    assert tracked, "no data files found: the package moved?"
    undeclared = [
        name for name in tracked if not any(fnmatch(name, p) for p in patterns)
    ]
    assert undeclared == []


def test_every_package_data_pattern_matches_a_file():
    with (ROOT / "pyproject.toml").open("rb") as fh:
        patterns = tomllib.load(fh)["tool"]["setuptools"]["package-data"]["embedcache"]
    files = [
        p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*") if p.is_file()
    ]
    stale = [p for p in patterns if not any(fnmatch(name, p) for name in files)]
    assert stale == []
