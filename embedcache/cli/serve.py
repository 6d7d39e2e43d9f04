"""`embedcache serve`: the embedding-cache service, one HTTP front door to a store.

Argument parsing only: the settings are built here and :func:`embedcache.service.
server.serve` runs them. The embedding options are those of `embed`, applied to
every ``--model``; a ``--config serve.toml`` declares models each with its own.
An option not given stays unset, so a ``--model`` and a ``[[model]]`` table share
one set of defaults (:class:`~embedcache.models.options.EmbedOptions`'s: float32)
and one model name is one key on every replica. Options given with no ``--model``
to apply to are refused, never ignored.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from embedcache.cli.common import add_store_argument
from embedcache.cli.model_options import (
    MODEL_OPTIONS,
    add_model_options,
    embed_options,
)

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
    # unset unless given: EmbedOptions' defaults apply, as to a [[model]] table
    p.set_defaults(**{**dict.fromkeys(MODEL_OPTIONS), "family_option": []})
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="serve.toml: settings and [[model]] tables (flags and then "
        "EMBEDCACHE_<SETTING> variables win over it)",
    )
    # the setting flags come from the settings model, whose import (pydantic) the
    # other commands and `embedcache --help` should not pay: added on serve's parse
    p.__class__ = _ServeParser
    p.set_defaults(func=_cmd_serve)


class _ServeParser(argparse.ArgumentParser):
    """The serve parser, adding the setting flags when it first parses."""

    def parse_known_args(
        self,
        args: list[str] | None = None,
        namespace: argparse.Namespace | None = None,
    ) -> tuple[argparse.Namespace, list[str]]:
        if not getattr(self, "_settings_added", False):
            add_setting_flags(self)
            self._settings_added = True
        return super().parse_known_args(args, namespace)


def add_setting_flags(p: argparse.ArgumentParser) -> None:
    """A flag per server setting, from its declaration (type, default, help); None
    unless given, so serve.toml, the environment or the default applies."""
    from embedcache.service.settings import SERVER_SETTINGS, ServeSettings

    taken = {action.dest for action in p._actions}  # --store, --threads
    for name in SERVER_SETTINGS:
        if name in taken:
            continue
        info = ServeSettings.model_fields[name]
        flag = "--" + name.replace("_", "-")
        text = f"{info.description} (default: {_shown(info.default)})"
        if info.annotation is bool:
            p.add_argument(flag, action="store_true", default=None, help=text)
            continue
        kind = next((t for t in (int, float) if info.annotation in (t, t | None)), str)
        p.add_argument(flag, type=kind, default=None, help=text)


def _shown(default: object) -> str:
    if isinstance(default, int) and not isinstance(default, bool) and default >= 2**20:
        return f"{default} = {default / 2**20:g} Mi"
    return "none" if default is None else str(default)


def _model_specs(args: argparse.Namespace) -> list[Any]:
    from embedcache.service.errors import ServeConfigError
    from embedcache.service.settings import ModelSpec, served_name

    # not None (and not --family-option's empty list): --layer 0 is given too
    flagged = [name for name in MODEL_OPTIONS if getattr(args, name) not in (None, [])]
    if flagged and not args.model:
        flags = ", ".join("--" + name.replace("_", "-") for name in flagged)
        msg = (
            f"{flags} apply to --model models and no --model is given; "
            f"set them in each [[model]] table of {args.config or 'serve.toml'}"
        )
        raise ServeConfigError(msg)
    options = {k: v for k, v in embed_options(args).items() if v is not None}
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
                options=options,
                token_budget=args.token_budget,
            )
        )
    return specs


def _cmd_serve(args: argparse.Namespace) -> int:
    from embedcache.service.server import serve
    from embedcache.service.settings import SERVER_SETTINGS, load_settings

    flags = {name: getattr(args, name) for name in SERVER_SETTINGS}
    settings = load_settings(
        flags,
        config=args.config,
        models=tuple(_model_specs(args)),
        environ=os.environ,
    )
    return serve(settings)
