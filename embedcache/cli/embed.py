"""`embedcache embed` (any sequences -> OUT.npy) and `embeddings` (a version's items).

Both print `computed=<N> cached=<M>` as their last stdout line: N distinct
sequences run through the model, M every other input row (already stored, or a
repeat of a sequence computed in the same run), so N + M = number of inputs. Each
handler is one call of :mod:`embedcache.engine.api`, which reads the input, loads
the model, opens the store and picks in-process or Dask; with ``--server`` it is
one call of :mod:`embedcache.client` instead, and the server's store fills.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from embedcache.cli.common import (
    add_data_dir_argument,
    add_store_argument,
    default_cluster,
    default_data_dir,
    default_store,
    positive_int,
    store_options,
)
from embedcache.cli.model_options import MODEL_OPTIONS, add_model_options, embed_options

_COUNTS_NOTE = (
    "The last line printed is `computed=<N> cached=<M>`: N distinct sequences ran "
    "through the model, M counts every other input row (already in the store, or a "
    "repeat of a sequence computed in this run); N + M is the number of inputs."
)


def add_embed_commands(sub: argparse._SubParsersAction) -> None:
    p = _add_embedding_parser(
        sub, "embed", "embed sequences from a file into OUT.npy, caching in the store"
    )
    _add_server_option(p)
    p.add_argument(
        "--input",
        type=Path,
        required=True,
        help="TSV with a 'seq' column, FASTA, or one sequence a line",
    )
    p.add_argument(
        "--output",
        type=Path,
        required=True,
        help="float32 (n, d) .npy, rows in input order",
    )
    p.set_defaults(func=_cmd_embed)

    p = _add_embedding_parser(
        sub,
        "embeddings",
        "embed every item (train and test) of a leaderboard version",
    )
    _add_server_option(p)
    p.add_argument(
        "--version",
        required=True,
        help="version name (e.g. atlas-full-v1) or a .toml file",
    )
    add_data_dir_argument(p)
    p.add_argument(
        "--with-rc",
        action="store_true",
        help="also embed the reverse complement of every test item (for the "
        "report's accuracy_rc; doubles the test set's cost)",
    )
    p.set_defaults(func=_cmd_embeddings)


def _add_embedding_parser(
    sub: argparse._SubParsersAction, name: str, help_text: str
) -> argparse.ArgumentParser:
    """A command that embeds: the counts note as its description, the model options."""
    p = sub.add_parser(name, help=help_text, description=_COUNTS_NOTE)
    p.add_argument(
        "--model",
        required=True,
        help="kmer-1..kmer-6, gc, a local HF directory, or a hub id (with "
        "--server: a name the server serves)",
    )
    add_store_argument(p)
    add_model_options(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--cluster",
        default=default_cluster(),
        metavar="SPEC",
        help="run on Dask: local:N starts N worker processes for this run, "
        "tcp://HOST:PORT uses a running scheduler (default: $EMBEDCACHE_CLUSTER; "
        "unset or 'none': in this process). The store must be reachable by every worker",
    )
    p.add_argument(
        "--unit-tokens",
        type=positive_int,
        default=None,
        metavar="N",
        help="with --cluster: sequence tokens per work unit (default: sized to a "
        "few seconds of a worker's measured rate, 4k-1M tokens)",
    )
    return p


def _add_server_option(p: argparse.ArgumentParser) -> None:
    """``--server``; after the model options, whose defaults it records."""
    p.add_argument(
        "--server",
        default=os.environ.get("EMBEDCACHE_SERVER") or None,
        metavar="URL",
        help="embed through a running `embedcache serve` (its model, options and "
        "store) instead of loading the model here (default: $EMBEDCACHE_SERVER; "
        "'none': here); an API key is read from $EMBEDCACHE_API_KEY",
    )
    # what a server fixes for its model; given with --server, they are an error
    p.set_defaults(local_defaults={d: p.get_default(d) for d in _LOCAL_ONLY})


_LOCAL_ONLY = ("store", *MODEL_OPTIONS, "threads", "cluster", "unit_tokens")


def _server_arguments(args: argparse.Namespace) -> dict[str, Any] | None:
    """``server`` and ``api_key`` when the command runs through a server, else None.

    Raises
    ------
    AdapterOptionError
        A model or engine option is given with ``--server``, which fixes them.
    """
    from embedcache.errors import AdapterOptionError

    if not args.server or args.server.strip().lower() == "none":
        return None
    given = [
        "--" + name.replace("_", "-")
        for name, default in args.local_defaults.items()
        if getattr(args, name) != default
    ]
    if given:
        msg = (
            f"{', '.join(given)} cannot be given with --server {args.server}: the "
            f"server's model {args.model!r} fixes its options, store and compute (see "
            "`GET /v1/models`); drop them, or pass --server none to embed here"
        )
        raise AdapterOptionError(msg)
    return {
        "server": args.server,
        "api_key": os.environ.get("EMBEDCACHE_API_KEY") or None,
    }


def _engine_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """What both commands pass to the engine besides the model and the sequences."""
    from embedcache.engine.api import wants_cluster

    if wants_cluster(args.cluster) and not getattr(args, "verbose", False):
        # Dask logs every worker and connection (its import sets its level to INFO);
        # embedcache's own lines say what runs where
        import distributed  # noqa: F401

        logging.getLogger("distributed").setLevel(logging.WARNING)
    location = args.store or default_store()
    return {
        "store": location,
        "store_options": store_options(location),
        "revision": args.revision,
        "options": embed_options(args),
        "token_budget": args.token_budget,
        "cluster": args.cluster,
        "unit_tokens": args.unit_tokens,
        "threads": args.threads,
        "progress": not args.no_progress and sys.stderr.isatty(),
    }


def _cmd_embed(args: argparse.Namespace) -> int:
    from embedcache.engine.api import embed_file

    if args.output.suffix != ".npy":
        print(
            f"embedcache: error: --output {args.output} must end in .npy",
            file=sys.stderr,
        )
        return 2
    server = _server_arguments(args)
    if server is not None:
        from embedcache.client import embed_file_on_server

        result = embed_file_on_server(
            args.input, args.model, output=args.output, **server
        )
        layers = []
    else:
        result = embed_file(
            args.input, args.model, output=args.output, **_engine_arguments(args)
        )
        layers = [key.layer for key in result.keys]
    print(
        f"wrote {result.vectors.shape[0]} x {result.vectors.shape[1]} float32 to {args.output}"
    )
    if len(layers) > 1:
        print(f"{args.output} holds layer {layers[0]}; layers {layers} are stored")
    print(f"computed={result.n_computed} cached={result.n_cached}")
    return 0


def _cmd_embeddings(args: argparse.Namespace) -> int:
    from embedcache.engine.api import embed_version

    data_dir = args.data_dir or default_data_dir()
    server = _server_arguments(args)
    if server is not None:
        from embedcache.client import embed_version_on_server

        if args.with_rc:
            print(
                "embedcache: error: --with-rc is not available with --server; "
                "run `embedcache embeddings --with-rc` without --server on a machine "
                "that opens the store",
                file=sys.stderr,
            )
            return 2
        subset, result = embed_version_on_server(
            args.version, args.model, data_dir=data_dir, **server
        )
    else:
        subset, result = embed_version(
            args.version,
            args.model,
            data_dir=data_dir,
            with_rc=args.with_rc,
            **_engine_arguments(args),
        )
    rc = " and the test items' reverse complements" if args.with_rc else ""
    print(
        f"{subset.version.name} (subset {subset.subset_id}): {subset.items.height} "
        f"items{rc} embedded with {args.model}"
    )
    print(f"computed={result.n_computed} cached={result.n_cached}")
    return 0
