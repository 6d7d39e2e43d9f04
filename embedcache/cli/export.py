"""`embedcache export`: a version's items with one model's stored vectors, to a file."""

from __future__ import annotations

import argparse
from pathlib import Path

from embedcache.cli.common import (
    add_data_dir_argument,
    add_store_argument,
    default_data_dir,
    default_store,
    store_options,
)


def add_export_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="write every item of a version with one model's stored vector "
        "(.parquet or .npz), to probe in your own code",
        description="One row per item (train and test): item_id, dataset, split, "
        "label, seq_sha256 and the float32 vector (a fixed-size array column in "
        ".parquet; an (n, d) array in .npz).",
    )
    p.add_argument(
        "--model",
        required=True,
        help="a model id in the store, or a key digest prefix (8+ hex digits) "
        "when several keys share the id",
    )
    p.add_argument(
        "--version", required=True, help="a shipped version name or a version .toml"
    )
    p.add_argument(
        "--output", type=Path, required=True, help="FILE.parquet or FILE.npz"
    )
    add_store_argument(p)
    add_data_dir_argument(p)
    p.set_defaults(func=_cmd_export)


def _cmd_export(args: argparse.Namespace) -> int:
    from embedcache.report.export import export_version

    location = args.store or default_store()
    subset, export = export_version(
        args.version,
        args.model,
        location,
        args.output,
        data_dir=args.data_dir or default_data_dir(),
        store_options=store_options(location),
    )
    print(
        f"{subset.version.name} (subset {subset.subset_id}): wrote {export.frame.height} items "
        f"x {export.dim} float32 of {export.key.short()} (key {export.key.digest[:12]}) "
        f"to {args.output}"
    )
    return 0
