"""Open a store's location and its groups: the root, and one group per model key."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from embedcache.errors import StoreError
from embedcache.store.backend import Backend, is_url, open_object_store
from embedcache.store.layout import (
    COMMITS_KIND,
    LOG_KIND,
    META,
    RUNS_KIND,
    SCHEMA_VERSION,
    STORE_KIND,
    commits_prefix,
    embedcache_version,
    group_attrs,
    group_doc,
    is_key_digest,
    key_attrs,
    log_prefix,
    parse_key_doc,
    runs_prefix,
)
from embedcache.store.snapshots import KeyView

if TYPE_CHECKING:
    from collections.abc import Mapping

    from embedcache.specs import ModelKey

logger = logging.getLogger(__name__)


def open_backend(
    root: Any,  # noqa: ANN401 (a path, a URL, or an obstore store)
    options: Mapping[str, str] | None,
    *,
    create: bool,
) -> Backend:
    """The backend for a folder, a URL or an obstore store object."""
    if not isinstance(root, str | os.PathLike):
        return Backend(root)
    text = os.fspath(root)
    if is_url(text):
        return Backend(open_object_store(text, options), location=text.rstrip("/"))
    path = Path(text)
    if not path.is_dir():
        if not create:
            msg = f"no embedcache store at {path} (no such folder)"
            raise StoreError(msg)
        path.mkdir(parents=True, exist_ok=True)
    return Backend(open_object_store(path, options), location=text)


def open_root(backend: Backend, *, create: bool) -> bool:
    """Check (or create) the root group; return whether the store may be written.

    A remote backend's put-if-absent is probed first: one that overwrites is
    refused (StoreError), and credentials that may not write open read-only.
    """
    doc = backend.read_or_none(META)
    writable = backend.probe_put_if_absent() if backend.needs_probe else True
    if doc is None:
        if not create:
            msg = f"no embedcache store at {backend.location} (no zarr.json there)"
            raise StoreError(msg)
        doc = _create_root(backend)
    group_attrs(doc, backend.describe(META), kind=STORE_KIND)
    return writable


def _create_root(backend: Backend) -> bytes:
    """Write the root group into an empty location; the root's document."""
    folders, files = backend.list_dir("")
    names = [*folders, *(f.path.rpartition("/")[2] for f in files)]
    if any(not n.startswith(".") for n in names):
        # another writer may have created the store since we looked for zarr.json
        doc = backend.read_or_none(META)
        if doc is not None:
            return doc
        msg = (
            f"{backend.location} is not empty and is not an embedcache store (no "
            "zarr.json); choose a new or empty folder or prefix for the store"
        )
        raise StoreError(msg)
    attrs = {
        "kind": STORE_KIND,
        "schema_version": SCHEMA_VERSION,
        "embedcache_version": embedcache_version(),
    }
    # put-if-absent: of two writers creating the store at once, one document wins
    backend.create(META, group_doc(attrs))
    return backend.read(META)


def list_keys(backend: Backend) -> list[ModelKey]:
    """The model keys of every key group, by digest."""
    folders, _ = backend.list_dir("")
    digests = [d for d in folders if is_key_digest(d)]
    paths = [f"{d}/{META}" for d in digests]
    keys = []
    for digest, path, doc in zip(digests, paths, backend.read_many(paths), strict=True):
        if doc is not None:  # a folder without zarr.json is not a key group
            keys.append(parse_key_doc(doc, backend.describe(path), digest)[0])
    return keys


def open_key(
    backend: Backend, key: ModelKey, *, create_dim: int | None = None
) -> KeyView | None:
    """An (unrefreshed) view of a key group; None if absent and not ``create_dim``."""
    path = f"{key.digest}/{META}"
    doc = backend.read_or_none(path)
    if doc is None:
        if create_dim is None:
            return None
        _create_key(backend, key, create_dim)
        doc = backend.read(path)
    _, dim = parse_key_doc(doc, backend.describe(path), key.digest)
    return KeyView(key, key.digest, dim)


def _create_key(backend: Backend, key: ModelKey, dim: int) -> None:
    # subgroups first: whenever the key's zarr.json exists, so do they
    for folder, kind in (
        (runs_prefix(key.digest), RUNS_KIND),
        (commits_prefix(key.digest), COMMITS_KIND),
        (log_prefix(key.digest), LOG_KIND),
    ):
        attrs = {"kind": kind, "schema_version": SCHEMA_VERSION}
        backend.create(f"{folder}/{META}", group_doc(attrs))
    # put-if-absent: a concurrent writer's group (maybe of another dim) wins and is
    # then checked like any existing group
    if backend.create(f"{key.digest}/{META}", group_doc(key_attrs(key, dim))):
        logger.info("created group %s for %s (dim %d)", key.digest, key.short(), dim)
