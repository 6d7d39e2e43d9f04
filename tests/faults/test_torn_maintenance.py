"""``compact`` killed with SIGKILL at each point of its work (``migrate``:
``test_migrate_killed.py``).

A subprocess (``maintenance_worker.py``) wraps the store function a point names so
that reaching it kills the process; the test checks the exit status (-9: the point
was reached), then that the store reads every row once and the next run finishes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from embedcache.store import EmbeddingStore, layout
from tests.store.conftest import StoreHandle
from tests.store.worker import KEY, dataset, watching_collector

WORKER = Path(__file__).with_name("maintenance_worker.py")
N = 120


def run_killed(root, op: str, point: str, options=None) -> None:
    opts = ["--options", json.dumps(options)] if options else []
    done = subprocess.run(
        [sys.executable, str(WORKER), str(root), op, point, *opts],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == -9, (done.returncode, done.stdout, done.stderr[-2000:])


def rows_stored(store: EmbeddingStore) -> int:
    """Rows of the visible runs: more than the distinct hashes means a duplicate."""
    view = store._view(KEY)
    return sum(s.record.n_rows for s in view.runs)


def assert_every_row_once(store: EmbeddingStore, hashes, vectors) -> None:
    got, found = store.get(KEY, hashes)
    assert found.all()
    np.testing.assert_array_equal(got, vectors)
    assert store.keys()[0].n_vectors == len(hashes)
    assert store.verify() == []


@pytest.fixture(params=["local", "s3"])
def filled(request, tmp_path):
    """A store holding N rows in 4 runs, on a folder or on moto's S3."""
    if request.param == "local":
        handle = StoreHandle("local", str(tmp_path / "store"))
    else:
        handle = request.getfixturevalue("s3_handle")
    hashes, vectors = dataset(N)
    store = handle.open(auto_merge=0)
    for i in range(0, N, N // 4):
        store.put(KEY, hashes[i : i + N // 4], vectors[i : i + N // 4])
    return handle, hashes, vectors


@pytest.fixture
def s3_handle(request):
    from tests.store.conftest import new_bucket, s3_options

    endpoint = request.getfixturevalue("s3_endpoint")
    return StoreHandle(
        "s3", f"s3://{new_bucket(endpoint)}/embeddings", s3_options(endpoint)
    )


@pytest.mark.parametrize(
    "point", ["before-write", "before-commit", "after-publish", "mid-retire"]
)
def test_compact_killed_at_each_point_loses_nothing_and_is_finished_later(
    filled, point
):
    handle, hashes, vectors = filled
    run_killed(handle.root, "compact", point, handle.options)
    store = handle.open()
    assert_every_row_once(store, hashes, vectors)
    # the merged run is visible only from its commit on, and then hides the old
    expected = 1 if point in ("after-publish", "mid-retire") else 4
    assert store.keys()[0].n_runs == expected
    assert rows_stored(store) == N
    store.compact()
    assert store.keys()[0].n_runs == 1
    assert rows_stored(store) == N
    if point == "before-commit":  # its writer's lease is fresh: the run stays
        (leftover,) = store.garbage()
        session = layout.session_of(leftover.rstrip("/").rpartition("/")[2])
        assert handle.paths(layout.lease_path(session))
    # the killed compaction's leftover goes once its lease expired by the margin
    # (a collector whose clock is an hour ahead), and the lease with it
    later = watching_collector(handle)
    later.compact()
    assert later.garbage() == []
    assert handle.paths("leases/*/zarr.json") == []
    assert_every_row_once(handle.open(), hashes, vectors)
