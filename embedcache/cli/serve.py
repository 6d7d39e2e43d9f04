"""`embedcache serve`: the embedding-cache service, one HTTP front door to a store.

Argument parsing only: the settings are built here and :func:`embedcache.service.
server.serve` runs them. The embedding options are those of `embed`, applied to
every ``--model``; a ``--config serve.toml`` declares models each with its own.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from embedcache.cli.common import (
    add_store_argument,
    default_store,
    positive_int,
    store_options,
)
from embedcache.cli.model_options import add_model_options, embed_options

_DESCRIPTION = (
    "Serve embeddings over HTTP: POST /v1/embeddings (OpenAI-compatible), POST "
    "/v1/embed (JSON, Arrow or NPY), GET /v1/models, /health/live, /health/ready, "
    "/metrics, /openapi.json. Hits are answered from the store; misses are batched "
    "across requests, computed once and committed before the reply."
)


def add_serve_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve embeddings over HTTP from the store (a lab's front door)",
        description=_DESCRIPTION,
    )
    # repeatable, and optional with --config
    p.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="[NAME=]MODEL",
        help="a model to serve (repeatable): kmer-4, a local directory or a hub id, "
        "served as NAME (default: the model, or a directory's folder name)",
    )
    add_store_argument(p)
    add_model_options(p)
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="serve.toml: settings and [[model]] tables",
    )
    p.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port (default 8000)")
    p.add_argument(
        "--api-key-file",
        type=Path,
        default=None,
        help="keys clients send as `Authorization: Bearer KEY`, one a line; mode 600",
    )
    p.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        default=None,
        help="allow a non-loopback --host without --api-key-file",
    )
    p.add_argument(
        "--ssl-certfile", default=None, help="TLS certificate (PEM), passed to uvicorn"
    )
    p.add_argument(
        "--ssl-keyfile", default=None, help="TLS private key (PEM), passed to uvicorn"
    )
    # the server's limits: None unless given, so serve.toml or the defaults apply
    for flag, kind, help_text in (
        ("--max-body-bytes", positive_int, "request body limit (default 16 MiB)"),
        ("--max-sequences", positive_int, "sequences per request (default 10000)"),
        (
            "--max-queue-tokens",
            positive_int,
            "queued tokens per model before 429 (default 32 Mi)",
        ),
        (
            "--batch-window-ms",
            float,
            "how long a batch that is not full waits for other requests (default 2)",
        ),
        (
            "--graceful-timeout",
            float,
            "seconds to drain on SIGTERM/SIGINT (default 30)",
        ),
    ):
        p.add_argument(flag, type=kind, default=None, help=help_text)
    p.set_defaults(func=_cmd_serve)


def _model_specs(args: argparse.Namespace) -> list[Any]:
    from embedcache.service.settings import ModelSpec, served_name

    specs = []
    for given in args.model:
        name, sep, model = given.partition("=")
        if not sep:
            name, model = served_name(given), given
        specs.append(
            ModelSpec(
                name=name,
                model=model,
                revision=args.revision,
                options=embed_options(args),
                token_budget=args.token_budget,
            )
        )
    return specs


def _cmd_serve(args: argparse.Namespace) -> int:
    from embedcache.service.server import serve
    from embedcache.service.settings import (
        ServeSettings,
        read_api_keys,
        read_serve_toml,
    )

    config: dict[str, Any] = {}
    models = []
    if args.config is not None:
        config, models = read_serve_toml(args.config)
    models += _model_specs(args)
    given = {
        "host": args.host,
        "port": args.port,
        "allow_unauthenticated": args.allow_unauthenticated,
        "ssl_certfile": args.ssl_certfile,
        "ssl_keyfile": args.ssl_keyfile,
        "max_body_bytes": args.max_body_bytes,
        "max_sequences": args.max_sequences,
        "max_queue_tokens": args.max_queue_tokens,
        "batch_window_ms": args.batch_window_ms,
        "graceful_timeout": args.graceful_timeout,
        "threads": args.threads,
    }
    config.update({name: value for name, value in given.items() if value is not None})
    key_file = args.api_key_file or config.pop("api_key_file", None)
    location = args.store or config.pop("store", None) or default_store()
    settings = ServeSettings(
        store=location,
        store_options=store_options(location),
        models=tuple(models),
        api_keys=read_api_keys(key_file) if key_file else (),
        **config,
    )
    return serve(settings)
