"""Command-line entry points (`embedcache ...`, called by the Makefile).

The only module that prints, reads environment variables or configures logging.
Each command group has its own `_add_*` function below; keep them apart.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from embedcache.errors import EmbedcacheError

logger = logging.getLogger(__name__)


def _default_store() -> Path:
    return Path(os.environ.get("EMBEDCACHE_STORE", "store"))


def _default_data_dir() -> Path | None:
    value = os.environ.get("EMBEDCACHE_DATA_DIR")
    return Path(value) if value else None


# --- foundation: versions, subset ---------------------------------------------------


def _add_data_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "versions", help="list the leaderboard versions with their datasets and n"
    )
    p.set_defaults(func=_cmd_versions)

    p = sub.add_parser("subset", help="draw a version's items and write its manifest")
    p.add_argument(
        "--version",
        required=True,
        help="a shipped version name or a version .toml file",
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=_default_data_dir(),
        help="local mirror of the datasets",
    )
    p.add_argument("--output", type=Path, required=True, help="manifest TSV to write")
    p.set_defaults(func=_cmd_subset)


def _cmd_versions(args: argparse.Namespace) -> int:
    from embedcache.versions import list_versions

    for version in list_versions():
        flag = "" if version.comparable else "  (not comparable to the leaderboard)"
        print(f"{version.name}  seed={version.seed}{flag}")
        for draw in version.datasets:
            n_test = (
                draw.n_test
                if draw.n_test is not None
                else ("rest" if draw.self_split else "all")
            )
            print(f"  {draw.name:<34} test={n_test!s:<6} train={draw.n_train}")
    return 0


def _cmd_subset(args: argparse.Namespace) -> int:
    from embedcache.subsets import draw_version, write_manifest
    from embedcache.versions import load_version

    subset = draw_version(load_version(args.version), data_dir=args.data_dir)
    write_manifest(subset, args.output)
    counts = subset.items.group_by("dataset", "split").len().sort("dataset", "split")
    for dataset, split, n in counts.iter_rows():
        print(f"{dataset:<34} {split:<5} {n}")
    print(f"wrote {subset.items.height} items to {args.output}")
    print(f"subset_id={subset.subset_id}")
    return 0


# --- store: ls, info, verify, compact -----------------------------------------------


def _add_store_commands(sub: argparse._SubParsersAction) -> None:
    pass


# --- engine: embed, embeddings ------------------------------------------------------


def _add_embed_commands(sub: argparse._SubParsersAction) -> None:
    pass


# --- report, demo -------------------------------------------------------------------


def _add_report_commands(sub: argparse._SubParsersAction) -> None:
    pass


# --- demo: the whole pipeline, offline -----------------------------------------------


def _add_demo_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="offline: draw demo-v1, embed it with the built-in floors, render its report",
    )
    p.add_argument("--store", type=Path, default=_default_store())
    p.add_argument("--output-dir", type=Path, default=Path("reports"))
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    from embedcache.models import BUILTIN_MODELS

    version = "demo-v1"
    store = str(args.store)
    steps = [
        [
            "subset",
            "--version",
            version,
            "--output",
            str(args.output_dir / version / "manifest.tsv"),
        ]
    ]
    steps += [
        ["embeddings", "--model", m, "--version", version, "--store", store]
        for m in BUILTIN_MODELS
    ]
    steps.append(
        [
            "report",
            "--version",
            version,
            "--store",
            store,
            "--output-dir",
            str(args.output_dir),
        ]
    )
    parser = build_parser()
    for step in steps:
        print(f"$ embedcache {' '.join(step)}", flush=True)
        step_args = parser.parse_args(step)
        code = int(step_args.func(step_args) or 0)
        if code:
            return code
    print(
        f"demo report: {args.output_dir / version / 'index.html'} (demo-v1 is not comparable to the leaderboard)"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="embedcache", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log at debug level"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_data_commands(sub)
    _add_store_commands(sub)
    _add_embed_commands(sub)
    _add_report_commands(sub)
    _add_demo_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        # the hub client logs every retry; our own error says what failed and what to do
        logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    try:
        return int(args.func(args) or 0)
    except EmbedcacheError as err:
        notes = "".join(f"\n  {note}" for note in getattr(err, "__notes__", ()))
        print(f"embedcache: error: {err}{notes}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("embedcache: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
