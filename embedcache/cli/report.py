"""`embedcache report` (probe a version, render its page) and `embedcache demo`.

The demo runs its steps through this command line's own parser, so it prints
exactly what a user typing them would see, each step after its `$ embedcache ...`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from embedcache.cli.common import default_data_dir, default_store, positive_int


def add_report_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="probe a version's stored embeddings and render reports/<version>/",
    )
    p.add_argument(
        "--version", required=True, help="a shipped version name or a version .toml"
    )
    p.add_argument(
        "--store", default=default_store(), help="a folder or s3://, gs://, az:// URL"
    )
    p.add_argument("--data-dir", type=Path, default=default_data_dir())
    p.add_argument(
        "--models",
        nargs="*",
        default=[],
        help="model ids to rank (default: every non-floor model in the store)",
    )
    p.add_argument("--output-dir", type=Path, default=Path("reports"))
    p.add_argument(
        "--n-boot", type=positive_int, default=1000, help="bootstrap resamples"
    )
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.add_argument(
        "--overlap",
        type=Path,
        default=None,
        metavar="FILE.toml",
        help="declare models' pretraining corpora for the board's Overlap column: "
        'one table per model id, ["owner/model"] with pretraining_data, '
        'human_genome ("" for none) and source',
    )
    p.set_defaults(func=_cmd_report)


def add_demo_command(
    sub: argparse._SubParsersAction, parser: argparse.ArgumentParser
) -> None:
    """``demo``, whose steps run through ``parser`` (the whole command line's)."""
    p = sub.add_parser(
        "demo",
        help="offline: draw demo-v1, embed it with the built-in floors and a "
        "random-init Caduceus control, render its report",
    )
    p.add_argument(
        "--store", default=default_store(), help="a folder or s3://, gs://, az:// URL"
    )
    p.add_argument("--output-dir", type=Path, default=Path("reports"))
    p.set_defaults(func=_cmd_demo, command_line=parser)


def _cmd_report(args: argparse.Namespace) -> int:
    from embedcache.report.render import render_report, summarize_report

    paths = render_report(
        args.version,
        store=args.store,
        data_dir=args.data_dir,
        models=args.models,
        output_dir=args.output_dir,
        n_boot=args.n_boot,
        seed=args.seed,
        overlap=args.overlap,
    )
    print(summarize_report(args.version, paths))
    return 0


def _demo_steps(store: str, output_dir: Path, version: str) -> list[list[str]]:
    """The commands the demo runs: draw, embed with every floor and a control, report."""
    from embedcache.models import BUILTIN_MODELS

    manifest = str(output_dir / version / "manifest.tsv")
    steps = [["subset", "--version", version, "--output", manifest]]
    steps += [
        [
            "embeddings",
            "--model",
            m,
            "--version",
            version,
            "--store",
            store,
            "--with-rc",
        ]
        for m in BUILTIN_MODELS
    ]
    # the neural row: a random-init Caduceus (shipped config, no trained weights),
    # labelled as a control, with every layer for the layer sweep; float32 pinned so
    # that the demo's results are the same on every kind of CPU
    control = ["--model", "caduceus-tiny", "--random-init", "0", "--layers", "all"]
    control += ["--dtype", "float32"]
    steps.append(
        ["embeddings", *control, "--version", version, "--store", store, "--with-rc"]
    )
    out = ["--output-dir", str(output_dir)]
    steps.append(["report", "--version", version, "--store", store, *out])
    return steps


def _cmd_demo(args: argparse.Namespace) -> int:
    version = "demo-v1"
    parser = args.command_line
    for step in _demo_steps(str(args.store), args.output_dir, version):
        print(f"$ embedcache {' '.join(step)}", flush=True)
        step_args = parser.parse_args(step)
        code = int(step_args.func(step_args) or 0)
        if code:
            return code
    print(
        f"demo report: {args.output_dir / version / 'index.html'} (demo-v1 is not comparable to the leaderboard)"
    )
    return 0
