"""A schema-1 store (tests/fixtures/store-schema1, written by embedcache 0.1) is refused
clearly, then migrated in place and read without recomputing anything."""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path

import numpy as np
import obstore
import pytest

from embedcache.cli import main
from embedcache.errors import CorruptStoreError, StoreError
from embedcache.store import SCHEMA_VERSION, EmbeddingStore, migrate, migrate_store

DATA = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.insert(0, str(DATA))
from make_store_schema1 import KEY_A, KEY_B


def copied(tmp_path: Path, version: int) -> Path:
    """A copy of the schema-``version`` fixture store (written by that embedcache)."""
    root = tmp_path / f"old{version}"
    shutil.copytree(DATA / f"store-schema{version}", root)
    return root


def uploaded(s3_handle, version: int) -> None:
    """The schema-``version`` fixture store's files into the S3 bucket."""
    fixture = DATA / f"store-schema{version}"
    for path in fixture.rglob("*"):
        if path.is_file():
            obstore.put(
                s3_handle.raw, path.relative_to(fixture).as_posix(), path.read_bytes()
            )


def expected(version: int = 1) -> dict:
    """{key: (hashes, vectors)} of the schema-``version`` fixture store."""
    return importlib.import_module(f"make_store_schema{version}").expected()


@pytest.fixture
def old_store(tmp_path) -> Path:
    return copied(tmp_path, 1)


def assert_reads_everything(store: EmbeddingStore, version: int = 1) -> None:
    for key, (hashes, vectors) in expected(version).items():
        got, found = store.get(key, hashes[::-1])
        assert found.all()
        np.testing.assert_array_equal(got, vectors[::-1])


def killed_after_one(monkeypatch, root: Path, name: str, version: int) -> None:
    """A migration of ``root`` killed (KeyboardInterrupt) on its second call of
    ``migrate.<name>``; the store is still refused as schema ``version``."""
    real, calls = getattr(migrate, name), []

    def once_then_crash(*args):
        if calls:
            raise KeyboardInterrupt
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(migrate, name, once_then_crash)
    with pytest.raises(KeyboardInterrupt):
        migrate_store(root)
    monkeypatch.undo()
    with pytest.raises(StoreError, match=f"schema_version {version}"):
        EmbeddingStore(root)  # the root flips last


def migrated_by_the_cli(root: Path, version: int, capsys) -> EmbeddingStore:
    """``embedcache store migrate`` of the schema-``version`` store at ``root``, its
    summary checked; the store, every fixture vector read back from it."""
    assert main(["store", "migrate", "--store", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"from schema_version {version} to 5: 2 keys, 3 runs" in out
    store = EmbeddingStore(root, create=False)
    assert_reads_everything(store, version)
    return store


@pytest.mark.parametrize("version", [1, 2, 3])
def test_an_old_schema_is_refused_with_the_migrate_command(tmp_path, version):
    root = copied(tmp_path, version)
    with pytest.raises(StoreError, match=f"schema_version {version}") as err:
        EmbeddingStore(root)
    assert "embedcache store migrate" in str(err.value)
    assert str(root / "zarr.json") in str(err.value)


def test_migrate_converts_in_place_and_everything_reads(old_store, capsys):
    files_before = {
        p.relative_to(old_store) for p in old_store.rglob("*/vectors/c/*/*")
    }
    store = migrated_by_the_cli(old_store, 1, capsys)
    infos = {i.key: i for i in store.keys()}  # noqa: SIM118 (a list, not a dict)
    assert (infos[KEY_A].n_vectors, infos[KEY_A].n_shards) == (12, 1)
    assert (infos[KEY_B].n_vectors, infos[KEY_B].n_shards) == (7, 2)
    assert store.verify() == []
    assert store.garbage() == []
    # the chunks were carried over, not rewritten; old records are gone
    assert {p.relative_to(old_store) for p in old_store.rglob("*/vectors/c/*/*")} == (
        files_before
    )
    assert not list(old_store.glob("*/commits/*~*.json"))  # <shard>.json of schema 1
    # and the store is a schema-2 store in every respect: it takes new vectors
    store.put(KEY_B, ["f" * 64], np.ones((1, 3), np.float32))
    store.compact()
    assert_reads_everything(EmbeddingStore(old_store))
    again = migrate_store(old_store)
    assert (again.from_version, again.n_keys) == (SCHEMA_VERSION, 0)


@pytest.mark.parametrize("version", [1, 2])
def test_migrate_works_on_an_object_store(s3_handle, version):
    uploaded(s3_handle, version)
    with pytest.raises(StoreError, match="store migrate"):
        s3_handle.open()
    done = migrate_store(s3_handle.root, options=s3_handle.options)
    assert (done.from_version, done.n_keys, done.n_runs) == (version, 2, 3)
    store = s3_handle.open(create=False)
    assert_reads_everything(store, version)
    assert store.verify() == []


def test_a_damaged_shard_stops_its_key_and_the_store_stays_schema_1(old_store):
    (chunk,) = old_store.glob(f"{KEY_A.digest}/shards/*/vectors/c/0/0")
    data = bytearray(chunk.read_bytes())
    data[10] ^= 0x01
    chunk.write_bytes(bytes(data))
    with pytest.raises(CorruptStoreError, match="sha256 differs") as err:
        migrate_store(old_store)
    assert str(chunk) in str(err.value)
    with pytest.raises(StoreError, match="schema_version 1"):
        EmbeddingStore(old_store)  # never half-read


def test_an_interrupted_migration_is_run_again(old_store, monkeypatch):
    killed_after_one(monkeypatch, old_store, "_migrate_key", 1)  # a key at a time
    done = migrate_store(old_store)
    assert (done.from_version, done.n_keys) == (1, 1)  # the other key
    store = EmbeddingStore(old_store)
    assert_reads_everything(store)
    assert store.verify() == []


# --- schema 2 (tests/fixtures/store-schema2, written by c11ce95's embedcache) ---------


def test_migrate_2_indexes_every_shard_and_every_vector_reads_back(tmp_path, capsys):
    from make_store_schema2 import KEY_A as KEY_A2
    from make_store_schema2 import KEY_B as KEY_B2

    store_2 = copied(tmp_path, 2)
    chunks = {p: p.read_bytes() for p in store_2.rglob("*/vectors/c/*/*")}
    store = migrated_by_the_cli(store_2, 2, capsys)
    for key, (hashes, _) in expected(2).items():
        assert store.hashes(key) == sorted(hashes)
    infos = {i.key: i for i in store.keys()}  # noqa: SIM118 (a list, not a dict)
    assert (infos[KEY_A2].n_vectors, infos[KEY_A2].n_shards) == (2100, 1)
    assert (infos[KEY_B2].n_vectors, infos[KEY_B2].n_shards) == (9, 2)
    assert infos[KEY_B2].aliases == ("fixture-b",)
    assert store.verify() == []
    assert store.garbage() == []  # the superseded shards went with the migration
    # vectors were carried over byte for byte; the superseded shards' are gone
    for path, data in chunks.items():
        assert not path.exists() or path.read_bytes() == data
    assert len(list(store_2.glob("*/shards/*/fences/c/0/0"))) == 3
    store.put(KEY_B2, ["f" * 64], np.ones((1, 3), np.float32))
    store.compact()
    after = {i.key: i.n_vectors for i in EmbeddingStore(store_2).keys()}  # noqa: SIM118
    assert after == {KEY_A2: 2100, KEY_B2: 10}
    again = migrate_store(store_2)
    assert (again.from_version, again.n_keys) == (SCHEMA_VERSION, 0)


# --- schema 3 (tests/fixtures/store-schema3, written by 46eff04's embedcache) ---------


@pytest.fixture
def store_3(tmp_path) -> Path:
    return copied(tmp_path, 3)


def test_migrate_3_rewrites_the_filters_and_every_vector_reads_back(store_3, capsys):
    from make_store_schema3 import KEY_A as KEY_A3
    from make_store_schema3 import KEY_B as KEY_B3

    chunks = {p: p.read_bytes() for p in store_3.rglob("*/vectors/c/*/*")}
    sorted_before = {p: p.read_bytes() for p in store_3.rglob("*/sorted_hashes/c/*/*")}
    blooms = {p: p.read_bytes() for p in store_3.rglob("*/bloom/c/*")}
    store = migrated_by_the_cli(store_3, 3, capsys)
    for key, (hashes, _) in expected(3).items():
        # a look-up large enough to consult the filters: no hash lost to them
        asked = [*hashes, "e" * 64]
        assert store.contains(key, asked).tolist() == [*([True] * len(hashes)), False]
    infos = {i.key: i for i in store.keys()}  # noqa: SIM118 (a list, not a dict)
    assert (infos[KEY_A3].n_vectors, infos[KEY_A3].n_shards) == (2100, 1)
    assert infos[KEY_B3].aliases == ("fixture-b",)
    assert store.verify() == []  # each filter checked against its shard's hashes
    assert store.garbage() == []
    # vectors and the sorted hashes carried over byte for byte; the filters are new
    for path, data in {**chunks, **sorted_before}.items():
        assert not path.exists() or path.read_bytes() == data
    kept = [p for p in blooms if p.exists()]
    assert kept
    assert all(p.read_bytes() != blooms[p] for p in kept)
    again = migrate_store(store_3)
    assert (again.from_version, again.n_keys) == (SCHEMA_VERSION, 0)


def test_an_interrupted_migration_from_3_is_run_again(store_3, monkeypatch):
    killed_after_one(monkeypatch, store_3, "_with_index", 3)  # a shard at a time
    assert migrate_store(store_3).from_version == 3
    store = EmbeddingStore(store_3)
    assert_reads_everything(store, 3)
    assert store.verify() == []
