"""A full disk: a store on a 1 MiB tmpfs fills up in the middle of an embedding run.

As root the test mounts a real size-limited tmpfs; where mounting is refused it
falls back to a wrapper around obstore's writes that raises ENOSPC once N bytes
are written, and says so (a warning in the test output).
"""

from __future__ import annotations

import errno
import os
import subprocess
import warnings

import numpy as np
import obstore
import pytest

from embedcache.engine.api import embed_into_store
from embedcache.errors import StoreFullError
from embedcache.hashing import sequence_key
from embedcache.models import load_adapter
from embedcache.store import EmbeddingStore

MODEL = "kmer-4"  # 256 floats: 1 KiB a vector, so ~1,000 fill 1 MiB
N = 2000


class SmallDisk:
    """A folder that holds about 1 MiB; ``grow()`` frees space."""

    def __init__(self, path, monkeypatch) -> None:
        self.path = path
        self.mounted = False
        self._monkeypatch = monkeypatch
        path.mkdir()
        if os.geteuid() == 0:
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)],
                capture_output=True,
                text=True,
                check=False,
            )
            self.mounted = done.returncode == 0
            why = done.stderr.strip()
        else:
            why = "not root"
        if not self.mounted:
            warnings.warn(
                f"cannot mount a small tmpfs ({why}): using the ENOSPC write wrapper",
                stacklevel=2,
            )
            self._limit = [1 << 20]
            self._wrap()

    def _wrap(self) -> None:
        written = [0]
        limit = self._limit
        put, put_async = obstore.put, obstore.put_async

        def check(data) -> None:
            written[0] += len(memoryview(data).cast("B"))
            if written[0] > limit[0]:
                raise OSError(errno.ENOSPC, "No space left on device")

        def small_put(store, path, data, **kwargs):
            check(data)
            return put(store, path, data, **kwargs)

        async def small_put_async(store, path, data, **kwargs):
            check(data)
            return await put_async(store, path, data, **kwargs)

        self._monkeypatch.setattr(obstore, "put", small_put)
        self._monkeypatch.setattr(obstore, "put_async", small_put_async)

    def grow(self) -> None:
        if self.mounted:
            subprocess.run(
                ["mount", "-o", "remount,size=64m", str(self.path)], check=True
            )
        else:
            self._limit[0] = 1 << 40

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], check=False)


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    disk = SmallDisk(tmp_path / "small", monkeypatch)
    yield disk
    disk.close()


def seqs_of(n: int) -> list[str]:
    rng = np.random.default_rng(7)
    return [
        "".join(rng.choice(list("ACGT"), size=rng.integers(30, 60))) for _ in range(n)
    ]


def test_a_full_disk_fails_clearly_keeps_earlier_commits_and_resumes(small_disk):
    root = small_disk.path / "store"
    seqs = seqs_of(N)
    hashes = [sequence_key(s) for s in seqs]
    reference = load_adapter(MODEL).embed_batch(seqs)
    with pytest.raises(StoreFullError) as err:
        embed_into_store(MODEL, seqs, root, token_budget=6000)
    message = str(err.value)
    assert "no space left" in message
    assert str(root) in message  # names the store
    # earlier commits stay readable and right; no partial run is committed
    store = EmbeddingStore(root)
    key = store.keys()[0].key
    got, found = store.get(key, hashes)
    assert 0 < found.sum() < N
    np.testing.assert_allclose(got[found], reference[found], rtol=1e-6)
    assert store.verify() == []
    assert store.garbage() == []  # the failed run was removed, not left half-made
    before = int(found.sum())
    small_disk.grow()
    result = embed_into_store(MODEL, seqs, root, token_budget=6000)
    assert result.n_computed == N - before
    np.testing.assert_allclose(result.vectors, reference, rtol=1e-6)
    fresh = EmbeddingStore(root)
    assert fresh.keys()[0].n_vectors == N
    assert fresh.verify() == []
