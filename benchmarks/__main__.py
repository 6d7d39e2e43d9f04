"""The benchmark harness.

``python -m benchmarks list``                 the benchmarks, one line each
``python -m benchmarks run NAME [--quick] …``  run one (other options go to it)

A benchmark: a module here with a docstring (its first line: what it measures) and a
top-level ``def main(argv)`` taking ``--quick`` and ending in a record. ``list`` imports
none.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # `python benchmarks/…` from anywhere


def discover(folder: Path = HERE) -> dict[str, str]:
    """{name: first docstring line} of every benchmark module in ``folder``."""
    found = {}
    for path in sorted(folder.glob("[!_]*.py")):
        text = path.read_text()
        doc = ast.get_docstring(ast.parse(text, filename=str(path)))
        if doc and re.search(r"^def main\(argv\b", text, re.MULTILINE):
            found[path.stem] = doc.splitlines()[0]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the benchmarks")
    run = sub.add_parser("run", add_help=False, help="run one (-h: its options)")
    run.add_argument("name")
    args, rest = parser.parse_known_args(argv)
    found = discover()
    if args.command == "list":
        width = max(map(len, found))
        for name, about in found.items():
            print(f"{name:<{width}}  {about}")
        return 0
    name = args.name if args.name in found else f"{args.name}_bench"
    if name not in found:
        parser.error(f"no benchmark {args.name!r}; `list` shows: {', '.join(found)}")
    module = importlib.import_module(f"benchmarks.{name}")
    return module.main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
