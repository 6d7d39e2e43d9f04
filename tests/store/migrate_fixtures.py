"""The schema-1 to -4 fixture stores (tests/fixtures/store-schema<N>) for the migrate
tests: copies of them, their rows, and what a migration may leave of them."""

from __future__ import annotations

import hashlib
import importlib
import json
import shutil
import sys
from pathlib import Path
from types import ModuleType

import numpy as np

from embedcache.store import EmbeddingStore

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
VERSIONS = (1, 2, 3, 4)


def maker(version: int) -> ModuleType:
    """``make_store_schema<version>``: the fixture's keys and ``expected()`` rows."""
    if str(FIXTURES) not in sys.path:
        sys.path.insert(0, str(FIXTURES))
    return importlib.import_module(f"make_store_schema{version}")


def expected(version: int) -> dict:
    """{key: (hashes, vectors)} of the schema-``version`` fixture store."""
    return maker(version).expected()


def copied(tmp_path: Path, version: int, name: str | None = None) -> Path:
    """A copy of the schema-``version`` fixture store (written by that embedcache)."""
    root = tmp_path / (name or f"old{version}")
    shutil.copytree(FIXTURES / f"store-schema{version}", root)
    return root


def tree_digests(root: Path) -> dict[str, str]:
    """sha256 of every object under ``root``, by path."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def key_schema(root: Path, digest: str) -> int:
    """The schema_version a key group's ``zarr.json`` says (its flip)."""
    doc = json.loads((root / digest / "zarr.json").read_bytes())
    return doc["attributes"]["embedcache"]["schema_version"]


def assert_reads(store: EmbeddingStore, rows: dict) -> None:
    """Every row of ``rows`` ({key: (hashes, vectors)}) is served, with its vector."""
    for key, (hashes, vectors) in rows.items():
        got, found = store.get(key, hashes[::-1])
        assert found.all(), key.short()
        np.testing.assert_array_equal(got, vectors[::-1])


def assert_flipped_keys_complete(root: Path, rows: dict, tmp_path: Path) -> None:
    """The flipped keys of a store whose root is not flipped yet read completely
    on their own: a copy with a schema-5 root serves each of their rows."""
    probe = tmp_path / f"probe-{root.name}"
    shutil.copytree(root, probe)
    doc = json.loads((probe / "zarr.json").read_bytes())
    doc["attributes"]["embedcache"]["schema_version"] = 5
    (probe / "zarr.json").write_text(json.dumps(doc))
    assert_reads(EmbeddingStore(probe, create=False), rows)
    shutil.rmtree(probe)
