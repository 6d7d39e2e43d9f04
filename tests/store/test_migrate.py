"""Stores of schemas 1-4 (tests/fixtures/store-schema<N>, each written by that
embedcache) are refused clearly, then migrated copy-then-flip and read without
recomputing anything; a refused migration leaves every object as it was."""

from __future__ import annotations

import json

import numpy as np
import obstore
import pytest

from embedcache.cli import main
from embedcache.errors import CorruptStoreError, StoreError
from embedcache.store import SCHEMA_VERSION, EmbeddingStore, migrate, migrate_store
from embedcache.store.backend import Backend
from tests.store.migrate_fixtures import (
    FIXTURES,
    VERSIONS,
    assert_reads,
    copied,
    expected,
    key_schema,
    maker,
    tree_digests,
)

KEY_A, KEY_B = maker(1).KEY_A, maker(1).KEY_B


def uploaded(s3_handle, version: int) -> None:
    """The schema-``version`` fixture store's files into the S3 bucket."""
    fixture = FIXTURES / f"store-schema{version}"
    for path in fixture.rglob("*"):
        if path.is_file():
            obstore.put(
                s3_handle.raw, path.relative_to(fixture).as_posix(), path.read_bytes()
            )


@pytest.fixture
def old_store(tmp_path):
    return copied(tmp_path, 1)


def migrated_by_the_cli(root, version: int, capsys) -> EmbeddingStore:
    """``embedcache store migrate`` of the schema-``version`` store at ``root``, its
    summary checked; the store, every fixture vector read back from it."""
    assert main(["store", "migrate", "--store", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"from schema_version {version} to 5: 2 keys, 3 runs" in out
    store = EmbeddingStore(root, create=False)
    assert_reads(store, expected(version))
    return store


def copies_of(before: dict[str, str], after: dict[str, str], part: str) -> None:
    """Every ``part`` object (``vectors/c``, ...) of a visible run is now its copy's
    (``<run>~v5``), byte for byte, and no old run is left."""
    kept = {p: d for p, d in before.items() if f"/{part}/" in p}
    moved = {p: d for p, d in after.items() if f"/{part}/" in p}
    assert all("~v5/" in p for p in moved)
    old_names = {p.replace("~v5/", "/", 1): d for p, d in moved.items()}
    assert old_names.items() <= kept.items()


@pytest.mark.parametrize("version", VERSIONS)
def test_an_old_schema_is_refused_with_the_migrate_command(tmp_path, version):
    root = copied(tmp_path, version)
    with pytest.raises(StoreError, match=f"schema_version {version}") as err:
        EmbeddingStore(root)
    assert "embedcache store migrate" in str(err.value)
    assert str(root / "zarr.json") in str(err.value)


def test_migrate_copies_each_run_and_everything_reads(old_store, capsys):
    before = tree_digests(old_store)
    store = migrated_by_the_cli(old_store, 1, capsys)
    infos = {i.key: i for i in store.keys()}  # noqa: SIM118 (a list, not a dict)
    assert (infos[KEY_A].n_vectors, infos[KEY_A].n_runs) == (12, 1)
    assert (infos[KEY_B].n_vectors, infos[KEY_B].n_runs) == (7, 2)
    assert store.verify() == []
    assert store.garbage() == []
    after = tree_digests(old_store)
    copies_of(before, after, "vectors")  # carried over, not recomputed
    assert not list(old_store.glob("*/commits/*~*.json"))  # <run>.json of schema 1
    # and the store is a schema-5 store in every respect: it takes new vectors
    store.put(KEY_B, ["f" * 64], np.ones((1, 3), np.float32))
    store.compact()
    assert_reads(EmbeddingStore(old_store), expected(1))
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
    assert_reads(store, expected(version))
    assert store.verify() == []


@pytest.mark.parametrize("version", VERSIONS)
def test_a_damaged_run_refuses_the_migration_and_no_object_changes(tmp_path, version):
    """The damaged run is in the key converted last: a migration that checked
    and converted key by key would have flipped the other key already."""
    root = copied(tmp_path, version)
    last = max(p.name for p in root.iterdir() if len(p.name) == 64)
    chunk = min(root.glob(f"{last}/shards/*/vectors/c/0/0"))
    data = bytearray(chunk.read_bytes())
    data[10] ^= 0x01
    chunk.write_bytes(bytes(data))
    before = tree_digests(root)
    with pytest.raises(CorruptStoreError, match="sha256 differs") as err:
        migrate_store(root)
    assert tree_digests(root) == before
    assert str(chunk) in str(err.value)
    assert "nothing was migrated" in str(err.value)
    with pytest.raises(StoreError, match=f"schema_version {version}"):
        EmbeddingStore(root)  # never half-read


@pytest.mark.parametrize("version", VERSIONS)
def test_a_live_old_writer_refuses_the_migration_and_no_object_changes(
    tmp_path, version
):
    root = copied(tmp_path, version)
    session = "old-writer~0123456789ab"
    lease = {"kind": "embedcache-lease", "schema_version": version, "writer": "w"}
    (root / "leases" / session).mkdir(parents=True)
    (root / "leases" / session / "zarr.json").write_text(
        json.dumps({"attributes": {"embedcache": lease}})
    )
    before = tree_digests(root)
    with pytest.raises(StoreError, match=f"schema {version} holds the lease"):
        migrate_store(root)
    assert tree_digests(root) == before


def writes_in_order(monkeypatch) -> list[tuple[str, str]]:
    """Every (op, path) the backend writes or deletes from now on, in order."""
    done: list[tuple[str, str]] = []

    def logged(op: str, real):
        def wrapper(self, first, *args, **kwargs):
            paths = [first] if isinstance(first, str) else list(first)
            done.extend((op, p) for p in paths)
            return real(self, paths[0] if isinstance(first, str) else paths, *args, **kwargs)  # fmt: skip

        return wrapper

    for op in ("write", "delete", "delete_many", "delete_prefixes"):
        monkeypatch.setattr(Backend, op, logged(op, getattr(Backend, op)))
    return done


@pytest.mark.parametrize("version", VERSIONS)
def test_no_old_object_is_written_or_deleted_before_its_key_flips(
    tmp_path, monkeypatch, version
):
    """Copy-then-flip: until a key's ``zarr.json`` says schema 5 (one write), its
    old objects are as the old embedcache left them, so an old reader reads it."""
    root = copied(tmp_path, version)
    old = set(tree_digests(root))
    done = writes_in_order(monkeypatch)
    migrate_store(root)
    monkeypatch.undo()
    for digest in {p.split("/")[0] for p in old if len(p.split("/")[0]) == 64}:
        flip = done.index(("write", f"{digest}/zarr.json"))
        touched = [
            path
            for _, path in done[:flip]
            if path.startswith(digest)
            and any(o == path or o.startswith(f"{path}/") for o in old)
        ]
        assert touched == [], touched
        assert any(path.startswith(f"{digest}/shards/") for _, path in done[:flip])
    assert_reads(EmbeddingStore(root), expected(version))


def test_an_interrupted_migration_is_run_again(old_store, monkeypatch):
    real, calls = migrate._convert_key, []

    def once_then_crash(*args):
        if calls:
            raise KeyboardInterrupt
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(migrate, "_convert_key", once_then_crash)
    with pytest.raises(KeyboardInterrupt):
        migrate_store(old_store)
    monkeypatch.undo()
    with pytest.raises(StoreError, match="schema_version 1"):
        EmbeddingStore(old_store)  # the root flips last
    done = migrate_store(old_store)
    assert (done.from_version, done.n_keys) == (1, 1)  # the other key
    store = EmbeddingStore(old_store)
    assert_reads(store, expected(1))
    assert store.verify() == []
    assert store.garbage() == []


def test_migrate_2_indexes_every_run_and_every_vector_reads_back(tmp_path, capsys):
    key_a, key_b = maker(2).KEY_A, maker(2).KEY_B
    store_2 = copied(tmp_path, 2)
    before = tree_digests(store_2)
    store = migrated_by_the_cli(store_2, 2, capsys)
    for key, (hashes, _) in expected(2).items():
        assert store.hashes(key) == sorted(hashes)
    infos = {i.key: i for i in store.keys()}  # noqa: SIM118 (a list, not a dict)
    assert (infos[key_a].n_vectors, infos[key_a].n_runs) == (2100, 1)
    assert (infos[key_b].n_vectors, infos[key_b].n_runs) == (9, 2)
    assert infos[key_b].aliases == ("fixture-b",)
    assert store.verify() == []
    assert store.garbage() == []  # the superseded runs went with the migration
    copies_of(before, tree_digests(store_2), "vectors")
    assert len(list(store_2.glob("*/shards/*~v5/fences/c/0/0"))) == 3
    store.put(key_b, ["f" * 64], np.ones((1, 3), np.float32))
    store.compact()
    after = {i.key: i.n_vectors for i in EmbeddingStore(store_2).keys()}  # noqa: SIM118
    assert after == {key_a: 2100, key_b: 10}
    again = migrate_store(store_2)
    assert (again.from_version, again.n_keys) == (SCHEMA_VERSION, 0)


def test_migrate_3_rewrites_the_filters_and_every_vector_reads_back(tmp_path, capsys):
    store_3 = copied(tmp_path, 3)
    before = tree_digests(store_3)
    store = migrated_by_the_cli(store_3, 3, capsys)
    for key, (hashes, _) in expected(3).items():
        # a look-up large enough to consult the filters: no hash lost to them
        asked = [*hashes, "e" * 64]
        assert store.contains(key, asked).tolist() == [*([True] * len(hashes)), False]
    infos = {i.key: i for i in store.keys()}  # noqa: SIM118 (a list, not a dict)
    assert infos[maker(3).KEY_A].n_vectors == 2100
    assert infos[maker(3).KEY_B].aliases == ("fixture-b",)
    assert store.verify() == []  # each filter checked against its run's hashes
    assert store.garbage() == []
    after = tree_digests(store_3)
    # vectors and the sorted hashes carried over byte for byte; the filters are new
    for part in ("vectors", "sorted_hashes"):
        copies_of(before, after, part)
    blooms = {p.replace("~v5/", "/", 1): d for p, d in after.items() if "/bloom/c" in p}
    assert blooms
    assert all(before.get(p) not in (None, d) for p, d in blooms.items())


def test_migrate_4_publishes_the_runs_in_the_order_old_readers_served(tmp_path):
    root = copied(tmp_path, 4)
    old_order = {}
    for record in root.glob("*/commits/*/zarr.json"):
        attrs = json.loads(record.read_bytes())["attributes"]["embedcache"]
        old_order.setdefault(record.parts[-4], []).append(
            (attrs["order_ns"], attrs["shard"], attrs["supersedes"])
        )
    migrate_store(root)
    for digest, runs in old_order.items():
        hidden = {s for _, _, sup in runs for s in sup}
        visible = [f"{name}~v5" for _, name, _ in sorted(runs) if name not in hidden]
        log = sorted((root / digest / "log").glob("*/zarr.json"))
        published = [
            json.loads(p.read_bytes())["attributes"]["embedcache"]["shard"] for p in log
        ]
        assert published == visible
    assert_reads(EmbeddingStore(root), expected(4))


def test_a_copy_that_fails_its_check_is_removed_and_its_key_not_flipped(
    tmp_path, monkeypatch
):
    """A copy written wrong (a storage that altered a vectors chunk) is caught by
    the check before the flip: the copies go, the key stays as it was."""
    root = copied(tmp_path, 4)
    before = tree_digests(root)
    write = Backend.write

    def altering(self, path, data, **kwargs):
        if "~v5/vectors/c/" in path:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        write(self, path, data, **kwargs)

    monkeypatch.setattr(Backend, "write", altering)
    with pytest.raises(CorruptStoreError, match="was not flipped") as err:
        migrate_store(root)
    monkeypatch.undo()
    assert "~v5/vectors/c/" in str(err.value)
    now = tree_digests(root)
    assert before.items() <= now.items()
    assert not [p for p in now if "~v5/" in p]


def test_a_log_entry_naming_another_run_stops_the_migration_before_the_flip(
    tmp_path,
):
    """An unflipped key's log holds an entry of another run (another migration at
    work, or one that saw other runs): migrate stops, naming it and the way out,
    and the key stays unflipped."""
    root = copied(tmp_path, 4)
    digest = min(p.name for p in root.iterdir() if len(p.name) == 64)
    entry = root / digest / "log" / f"{1:012d}" / "zarr.json"
    entry.parent.mkdir(parents=True)
    entry.write_text(json.dumps({"attributes": {"embedcache": {"shard": "other"}}}))
    with pytest.raises(StoreError, match="does not name run") as err:
        migrate_store(root)
    assert "delete the key's log/ folder" in str(err.value)
    assert key_schema(root, digest) == 4
    (root / digest / "log").rename(tmp_path / "stale-log")
    assert migrate_store(root).from_version == 4
    assert_reads(EmbeddingStore(root), expected(4))
