"""The store is a plain Zarr hierarchy: zarr-python alone walks it and reads every
committed vector, and the docs' recipe (docs/store/reading.md) does exactly that."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.storage import ObjectStore

from embedcache.specs import ModelKey
from embedcache.store import SCHEMA_VERSION
from embedcache.store.layout import LEASE_KIND, LEASES

RECIPE = Path(__file__).resolve().parents[2] / "docs" / "store" / "reading.md"
KEY_A = ModelKey(model_id="m/a", revision="a" * 40, adapter="t", adapter_version="1")
KEY_B = ModelKey(model_id="m/b", revision="b" * 40, adapter="t", adapter_version="1")


def hashes_of(n: int, prefix: str) -> list[str]:
    return [hashlib.sha256(f"{prefix}{i}".encode()).hexdigest() for i in range(n)]


def docs_recipe() -> dict:
    """Run the docs' "Reading the store without embedcache" code; return its names."""
    code = re.search(r"```python\n(.*?)```", RECIPE.read_text(), re.DOTALL)
    assert code is not None, "the docs page lost its code block"
    namespace: dict = {}
    exec(compile(code.group(1), str(RECIPE), "exec"), namespace)  # noqa: S102
    return namespace


@pytest.fixture
def busy_store(handle):
    """Two keys, merged and unmerged runs, duplicates, a superseded run not yet
    retired and a killed writer's leftover: everything a reader must see past."""
    store = handle.open(auto_merge=0)
    rng = np.random.default_rng(0)
    data = {}
    for key, dim in ((KEY_A, 8), (KEY_B, 3)):
        hs = hashes_of(90, key.model_id)
        vs = rng.standard_normal((90, dim)).astype(np.float32)
        for start in range(0, 90, 30):
            store.put(key, hs[start : start + 40], vs[start : start + 40])
        data[key] = (hs, vs)
    store.compact(KEY_A)  # superseding three runs, kept for their grace
    handle.write(f"{KEY_B.digest}/shards/w~gone~1~0/vectors/zarr.json", b"{")
    store.put(KEY_A, ["0" * 63 + "1"], np.full((1, 8), 7, np.float32))
    hs, vs = data[KEY_A]
    data[KEY_A] = ([*hs, "0" * 63 + "1"], np.vstack([vs, np.full((1, 8), 7)]))
    return handle, data


def zarr_root(handle):
    if handle.kind == "local":
        return handle.root
    return ObjectStore(handle.raw, read_only=True)


def test_every_folder_is_a_zarr_group(busy_store):
    handle, _ = busy_store
    root = zarr.open_group(zarr_root(handle), mode="r")
    assert root.attrs["embedcache"]["schema_version"] == SCHEMA_VERSION
    groups = set(root.group_keys())
    assert groups - {LEASES} == {KEY_A.digest, KEY_B.digest}
    if LEASES in groups:  # writers' leases: a group of lease groups
        for _, lease in root[LEASES].groups():
            assert lease.attrs["embedcache"]["kind"] == LEASE_KIND
    for digest in (KEY_A.digest, KEY_B.digest):
        key = root[digest]
        assert sorted(key.group_keys()) == ["commits", "log", "shards"]
        for _, entry in key["log"].groups():
            attrs = entry.attrs["embedcache"]
            name = attrs["shard"]
            assert key["commits"][name].attrs["embedcache"]["shard"] == name
            run = key["shards"][name]
            n = attrs["n_rows"]
            assert run["vectors"].shape == (n, key.attrs["embedcache"]["dim"])
            assert run["hashes"].shape == (n, 32)


def test_the_docs_recipe_reads_every_committed_vector(busy_store):
    handle, data = busy_store
    load_key = docs_recipe()["load_key"]
    store = handle.open(create=False)
    for key, (hs, vs) in data.items():
        vectors = load_key(zarr_root(handle), key.digest)
        assert sorted(vectors) == sorted(hs)  # the leftover adds nothing
        np.testing.assert_array_equal(np.stack([vectors[h] for h in hs]), vs)
        np.testing.assert_array_equal(store.get(key, hs)[0], vs)
