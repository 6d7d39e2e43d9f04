"""What every command group shares: defaults from the environment, argument types.

The only place besides ``main`` that reads environment variables.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from embedcache.store import EmbeddingStore

STORE_HELP = (
    "embedding store: a folder or s3://, gs://, az:// URL "
    "(default: $EMBEDCACHE_STORE or ./store)"
)


def default_store() -> str:
    return os.environ.get("EMBEDCACHE_STORE", "store")


def default_data_dir() -> Path | None:
    value = os.environ.get("EMBEDCACHE_DATA_DIR")
    return Path(value) if value else None


def default_cluster() -> str | None:
    return os.environ.get("EMBEDCACHE_CLUSTER") or None


def store_options(location: str) -> dict[str, str]:
    """The store options the environment gives for ``location`` (cloud credentials)."""
    from embedcache.store.options import storage_options

    return storage_options(location, os.environ)


def open_store(location: str | None) -> EmbeddingStore:
    """The existing store at a folder or URL (default: $EMBEDCACHE_STORE or ./store)."""
    from embedcache.store import EmbeddingStore

    location = location or default_store()
    return EmbeddingStore(location, options=store_options(location), create=False)


def add_store_argument(p: argparse.ArgumentParser) -> None:
    """``--store``, defaulting to None (resolved by :func:`default_store` when used)."""
    p.add_argument("--store", default=None, help=STORE_HELP)


def add_data_dir_argument(p: argparse.ArgumentParser) -> None:
    """``--data-dir``, defaulting to None (resolved by :func:`default_data_dir`)."""
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="local dataset folder (default: $EMBEDCACHE_DATA_DIR)",
    )


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        msg = f"must be a positive whole number, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return value
