"""Command-line entry points (`embedcache ...`, called by the Makefile).

The only package that prints, reads environment variables or configures logging.
Argument parsing only: one module per command group (``data``, ``store``,
``embed``, ``export``, ``models``, ``report``, ``serve``), each handler one package call plus
printing; ``common`` holds the defaults read from the environment and
``model_options`` the embedding options `embed`, `embeddings` and `serve` share. This module
builds the parser and runs a command, turning embedcache errors into exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from embedcache.cli.data import add_data_commands
from embedcache.cli.embed import add_embed_commands
from embedcache.cli.export import add_export_command
from embedcache.cli.models import add_models_command
from embedcache.cli.report import add_demo_command, add_report_commands
from embedcache.cli.serve import add_serve_command
from embedcache.cli.store import add_store_commands
from embedcache.errors import EmbedcacheError
from embedcache.extras import missing_extra

if TYPE_CHECKING:
    from collections.abc import Iterator

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="embedcache", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log at debug level"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_data_commands(sub)
    add_store_commands(sub)
    add_embed_commands(sub)
    add_export_command(sub)
    add_models_command(sub)
    add_report_commands(sub)
    add_demo_command(sub, parser)
    add_serve_command(sub)
    return parser


@contextlib.contextmanager
def _kernel_cache_env() -> Iterator[None]:
    """Point numba's kernel cache at a user cache dir for one command, unless set.

    Numba reads ``NUMBA_CACHE_DIR`` when a kernel module is first imported, and the
    worker processes a command starts inherit it; so compiled kernels are written
    outside the (possibly read-only) installed package and reused by later runs. A
    ``NUMBA_CACHE_DIR`` the user set wins; an unusable dir leaves numba its defaults.
    """
    from embedcache.models.shared.jitcache import default_cache_dir

    if os.environ.get("NUMBA_CACHE_DIR"):
        yield
        return
    try:
        path = default_cache_dir(
            xdg_cache_home=os.environ.get("XDG_CACHE_HOME"), home=Path.home()
        )
        path.mkdir(parents=True, exist_ok=True)
    except (OSError, RuntimeError) as err:  # RuntimeError: no home directory
        logger.debug(
            "no user cache dir for compiled kernels (%s); numba's default", err
        )
        yield
        return
    os.environ["NUMBA_CACHE_DIR"] = str(path)
    try:
        yield
    finally:
        os.environ.pop("NUMBA_CACHE_DIR", None)


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
    if getattr(args, "no_progress", False) or not sys.stderr.isatty():
        # read by huggingface_hub and transformers at import: no download or
        # weight-loading bars either (an explicit setting of the user's wins)
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        with _kernel_cache_env():
            return int(args.func(args) or 0)
    except ModuleNotFoundError as err:
        # an optional library of an extra the user did not install: say which
        missing = missing_extra(err, what=f"embedcache {args.command}")
        if missing is None:
            raise
        print(f"embedcache: error: {missing}", file=sys.stderr)
        return 2
    except EmbedcacheError as err:
        notes = "".join(f"\n  {note}" for note in getattr(err, "__notes__", ()))
        print(f"embedcache: error: {err}{notes}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("embedcache: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # output piped into `head` and the like: stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
