"""`embedcache versions` and `embedcache subset`: the leaderboard versions and draws."""

from __future__ import annotations

import argparse
from pathlib import Path

from embedcache.cli.common import default_data_dir


def add_data_commands(sub: argparse._SubParsersAction) -> None:
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
        default=default_data_dir(),
        help="local mirror of the datasets",
    )
    p.add_argument("--output", type=Path, required=True, help="manifest TSV to write")
    p.set_defaults(func=_cmd_subset)


def _cmd_versions(args: argparse.Namespace) -> int:
    from embedcache.data.versions import list_versions

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
    from embedcache.data.subsets import draw_version, write_manifest
    from embedcache.data.versions import load_version

    subset = draw_version(load_version(args.version), data_dir=args.data_dir)
    write_manifest(subset, args.output)
    counts = subset.items.group_by("dataset", "split").len().sort("dataset", "split")
    for dataset, split, n in counts.iter_rows():
        print(f"{dataset:<34} {split:<5} {n}")
    print(f"wrote {subset.items.height} items to {args.output}")
    print(f"subset_id={subset.subset_id}")
    return 0
