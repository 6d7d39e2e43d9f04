"""The storage interface: locations, options, and backends that cannot be trusted."""

from __future__ import annotations

import hashlib
import pickle
import threading

import numpy as np
import obstore
import pytest
from obstore.exceptions import PermissionDeniedError
from obstore.store import LocalStore, MemoryStore, S3Store

from embedcache.errors import StoreError
from embedcache.specs import ModelKey
from embedcache.store import EmbeddingStore, is_url, open_object_store
from embedcache.store import backend as backend_module
from embedcache.store.backend import Backend
from embedcache.store.layout import record_path
from embedcache.store.run_writes import SYNC_SOON_ROWS

KEY = ModelKey(model_id="m/b", revision="b" * 40, adapter="t", adapter_version="1")
HASHES = [hashlib.sha256(f"{i}".encode()).hexdigest() for i in range(5)]
VECTORS = np.arange(20, dtype=np.float32).reshape(5, 4)


def test_locations_are_paths_or_urls(tmp_path):
    assert is_url("s3://bucket/prefix")
    assert is_url("memory://")
    assert not is_url("store")
    assert not is_url(tmp_path / "x")
    assert isinstance(open_object_store(tmp_path), LocalStore)
    assert isinstance(open_object_store(f"file://{tmp_path}"), LocalStore)
    assert isinstance(open_object_store("memory://"), MemoryStore)
    with pytest.raises(StoreError, match="cannot open the folder"):
        open_object_store(tmp_path / "absent")
    with pytest.raises(StoreError, match="a local store takes none"):
        open_object_store(tmp_path, {"aws_region": "x"})


def test_options_reach_obstore_and_travel_as_plain_data():
    options = {
        "aws_access_key_id": "id",
        "aws_secret_access_key": "s3cret-value",
        "aws_region": "eu-west-1",
        "aws_endpoint_url": "http://127.0.0.1:9",
        "aws_allow_http": "true",  # an HTTP client option, not an S3 one
    }
    store = open_object_store("s3://bucket/some/prefix", options)
    assert isinstance(store, S3Store)
    assert store.prefix == "some/prefix"
    assert store.config["region"] == "eu-west-1"
    assert store.client_options["allow_http"] in {True, "true"}
    # a Dask worker gets the URL and options (or the pickled store) from its client
    assert pickle.loads(pickle.dumps(store)).config == store.config
    with pytest.raises(StoreError, match="no_such_option") as err:
        open_object_store("s3://bucket/prefix", {**options, "no_such_option": "1"})
    assert "s3cret-value" not in str(err.value)  # option names, never values


def test_memory_url_and_store_objects(tmp_path):
    fresh = EmbeddingStore("memory://")
    assert fresh.put(KEY, HASHES, VECTORS) == 5
    assert EmbeddingStore("memory://").keys() == []  # each URL: a new, empty store
    shared = MemoryStore()
    EmbeddingStore(shared).put(KEY, HASHES, VECTORS)
    np.testing.assert_array_equal(EmbeddingStore(shared).get(KEY, HASHES)[0], VECTORS)
    local = EmbeddingStore(LocalStore(tmp_path))
    local.put(KEY, HASHES, VECTORS)
    assert local.root == str(tmp_path)
    assert EmbeddingStore(f"file://{tmp_path}").keys()[0].n_vectors == 5


def test_a_server_that_overwrites_on_create_is_refused(s3_handle, monkeypatch):
    real_put = obstore.put

    def put_ignoring_mode(store, path, data, **kwargs):
        kwargs.pop("mode", None)  # as an S3 clone that ignores If-None-Match
        return real_put(store, path, data, **kwargs)

    monkeypatch.setattr(obstore, "put", put_ignoring_mode)
    with pytest.raises(StoreError, match="does not support put-if-absent") as err:
        s3_handle.open()
    assert str(s3_handle.root) in str(err.value)


def test_credentials_that_may_only_read_open_read_only(s3_handle, monkeypatch):
    s3_handle.open().put(KEY, HASHES, VECTORS)
    real_put = obstore.put

    def put_denied(store, path, data, **kwargs):
        if kwargs.get("mode") == "create":
            msg = "403 Forbidden"
            raise PermissionDeniedError(msg)
        return real_put(store, path, data, **kwargs)

    monkeypatch.setattr(obstore, "put", put_denied)
    reader = s3_handle.open(create=False)
    np.testing.assert_array_equal(reader.get(KEY, HASHES)[0], VECTORS)
    with pytest.raises(StoreError, match="read-only"):
        reader.put(KEY, [hashlib.sha256(b"new").hexdigest()], VECTORS[:1])


def test_no_async_obstore_call_reaches_python_from_rust_threads(tmp_path, monkeypatch):
    # obstore's *_async calls resolve on tokio threads that take the GIL; one still
    # doing so while the interpreter exits aborts the process (SIGABRT). Every store
    # operation must use the blocking calls instead.
    def refuse(name):
        def call(*args, **kwargs):
            msg = f"obstore.{name} was called"
            raise AssertionError(msg)

        return call

    for name in [n for n in dir(obstore) if n.endswith("_async")]:
        monkeypatch.setattr(obstore, name, refuse(name))
    for location in (tmp_path / "s", "memory://"):
        if not isinstance(location, str):
            location.mkdir()
        store = EmbeddingStore(location)
        store.put(KEY, HASHES[:3], VECTORS[:3])
        store.put(KEY, HASHES[3:], VECTORS[3:])
        store.compact(KEY)
        assert not store.verify()
        got, found = store.get(KEY, HASHES[::-1])
        assert found.all()
        np.testing.assert_array_equal(got, VECTORS[::-1])


@pytest.mark.parametrize("n", [10, SYNC_SOON_ROWS])  # synced at commit; as written
def test_each_object_of_a_run_is_fsynced_once_before_its_record_exists(
    tmp_path, monkeypatch, n
):
    synced: dict[str, int] = {}
    real_fsync = backend_module._fsync

    def fsync(path):
        real_fsync(path)
        if path.is_file():
            synced[str(path)] = synced.get(str(path), 0) + 1

    monkeypatch.setattr(backend_module, "_fsync", fsync)
    at_create: dict[str, dict[str, int]] = {}
    real_create = Backend.create

    def create(self, path, data):
        at_create[path] = dict(synced)
        return real_create(self, path, data)

    monkeypatch.setattr(Backend, "create", create)
    store = EmbeddingStore(tmp_path, auto_merge=0)
    hashes = [hashlib.sha256(f"s{i}".encode()).hexdigest() for i in range(n)]
    vectors = np.random.default_rng(0).random((n, 4), dtype=np.float32)
    assert store.put(KEY, hashes, vectors) == n
    (run,) = [p for p in (tmp_path / KEY.digest / "shards").iterdir() if p.is_dir()]
    files = sorted(str(p) for p in run.rglob("*") if p.is_file())
    assert len(files) > (60 if n == SYNC_SOON_ROWS else 5)  # many chunks, or few
    before = at_create[record_path(KEY.digest, run.name)]
    assert {f: before.get(f) for f in files} == dict.fromkeys(files, 1)
    assert not store._backend._syncing  # every fsync started was waited for
    got, found = store.get(KEY, hashes[-3:])
    assert found.all()
    np.testing.assert_array_equal(got, vectors[-3:])


def test_a_sync_waits_for_the_fsync_a_write_started(tmp_path, monkeypatch):
    gate = threading.Event()
    synced: list[str] = []
    real_fsync = backend_module._fsync

    def fsync(path):
        if path.name == "chunk":
            gate.wait(10)  # a slow disk, until the test lets it finish
        real_fsync(path)
        synced.append(path.name)

    monkeypatch.setattr(backend_module, "_fsync", fsync)
    backend = Backend(open_object_store(tmp_path))
    backend.write("a/chunk", b"x" * 100, sync_soon=True)
    backend.write("a/doc", b"y")
    syncing = threading.Thread(target=backend.sync, args=(["a/chunk", "a/doc"],))
    syncing.start()
    syncing.join(0.2)
    assert syncing.is_alive()  # waiting for the chunk's fsync, started at its write
    assert "chunk" not in synced
    gate.set()
    syncing.join(10)
    assert not syncing.is_alive()
    assert synced.count("chunk") == 1  # not fsynced a second time
    assert synced.count("doc") == 1
    assert not backend._syncing
