"""A store dropped without ``close()``: its finaliser deletes the lease without
blocking the thread a garbage collection ran it on."""

from __future__ import annotations

import threading

import numpy as np

from embedcache.store import EmbeddingStore
from embedcache.store.backend import Backend
from tests.store.worker import KEY, dataset


def test_a_finaliser_off_the_main_thread_never_blocks_it(tmp_path, monkeypatch):
    root = tmp_path / "store"
    store = EmbeddingStore(root)
    hashes, vectors = dataset(4)
    store.put(KEY, hashes, vectors.astype(np.float32))
    store._writer.lease.hold()  # a writer mid-run: its lease is on disk
    assert list(root.glob("leases/*/zarr.json"))
    release, deleting = threading.Event(), threading.Event()
    delete = Backend.delete

    def slow_delete(self: Backend, path: str) -> None:
        deleting.set()
        release.wait(30)  # as a request only the blocked thread could answer
        delete(self, path)

    monkeypatch.setattr(Backend, "delete", slow_delete)
    finaliser = threading.Thread(target=store._closer)  # as a GC on another thread
    finaliser.start()
    finaliser.join(10)
    assert not finaliser.is_alive(), "the finaliser blocked the thread it ran on"
    assert deleting.wait(10), "the lease was never deleted"
    release.set()
    for thread in threading.enumerate():
        if thread.name == "close-lease":
            thread.join(10)
    assert not list(root.glob("leases/*/zarr.json"))
