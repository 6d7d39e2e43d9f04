"""``store migrate`` SIGKILLed between object writes, from every schema (1-4).

A subprocess (``migrate_worker.py``) dies at a point: before the first copy, in
the middle of one, with the second key copied but not flipped, right after the
first key's flip, in the middle of its clean-up, before the root flips. After
each kill the root is as it was, and each key either is as the old embedcache
left it (every old object byte for byte; that embedcache, taken from the
repository's history, reads it) or is complete in schema 5 (never a mix); a
second run finishes, and every row is served with its vector.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from embedcache.store import EmbeddingStore, migrate_store
from tests.faults.migrate_worker import POINTS
from tests.store.migrate_fixtures import (
    FIXTURES,
    VERSIONS,
    assert_flipped_keys_complete,
    assert_reads,
    copied,
    expected,
    key_schema,
    tree_digests,
)

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("migrate_worker.py")
OLD_READER = Path(__file__).with_name("old_reader.py")
# the commits that wrote each fixture (see tests/fixtures/make_store_schema<N>.py)
OLD_COMMITS = {1: "e5f0cc7", 2: "c11ce95", 3: "46eff04", 4: "a0b9f37"}
# keys flipped (of the fixtures' two) when each point is reached
FLIPPED = {
    "before-copy": 0,
    "mid-copy": 0,
    "before-flip": 1,
    "after-flip": 1,
    "mid-cleanup": 1,
    "before-root": 2,
}
assert FLIPPED.keys() == POINTS.keys()


def run_worker(root: Path, point: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(WORKER), str(root), point],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def killed_at(root: Path, point: str) -> Path:
    done = run_worker(root, point)
    assert done.returncode == -9, (done.returncode, done.stdout, done.stderr[-2000:])
    return root


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """``killed(version, point, into)``: a copy, under ``into``, of the fixture
    store of ``version`` whose migration was killed at ``point`` (killed once)."""
    made: dict[tuple[int, str], Path] = {}
    base = tmp_path_factory.mktemp("killed")

    def get(version: int, point: str, into: Path) -> Path:
        if (version, point) not in made:
            root = copied(base, version, f"{version}-{point}")
            made[version, point] = killed_at(root, point)
        target = into / f"killed-{version}-{point}"
        shutil.copytree(made[version, point], target)
        return target

    return get


def assert_old_or_complete(root: Path, version: int, tmp_path: Path) -> int:
    """Each key of a killed migration's store as the old embedcache left it, or
    complete in schema 5; the root not flipped. The number of flipped keys."""
    fixture = tree_digests(FIXTURES / f"store-schema{version}")
    now = tree_digests(root)
    assert now["zarr.json"] == fixture["zarr.json"]
    flipped = {}
    for key, rows in expected(version).items():
        schema = key_schema(root, key.digest)
        if schema == version:
            old = {p: d for p, d in fixture.items() if p.startswith(key.digest)}
            assert old.items() <= now.items()
        else:
            assert schema == 5
            flipped[key] = rows
    if flipped:
        assert_flipped_keys_complete(root, flipped, tmp_path)
    return len(flipped)


def assert_run_again_finishes(root: Path, version: int) -> None:
    assert migrate_store(root).from_version == version
    store = EmbeddingStore(root)
    assert_reads(store, expected(version))
    assert store.verify() == []
    assert store.garbage() == []


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("version", VERSIONS)
def test_a_killed_migration_leaves_each_key_old_or_complete(
    killed, tmp_path, version, point
):
    root = killed(version, point, tmp_path)
    assert assert_old_or_complete(root, version, tmp_path) == FLIPPED[point]
    assert_run_again_finishes(root, version)


@pytest.fixture(scope="module")
def old_embedcache(tmp_path_factory):
    """``old_embedcache(version)``: a folder holding the ``embedcache`` package of
    the commit that wrote the schema-``version`` fixture (``git archive``)."""
    trees: dict[int, Path] = {}

    def get(version: int) -> Path:
        if version in trees:
            return trees[version]
        if shutil.which("git") is None:
            pytest.skip("git is not installed: the old embedcache comes from history")
        commit = OLD_COMMITS[version]
        done = subprocess.run(
            ["git", "-C", str(REPO), "archive", "--format=tar", commit, "embedcache"],
            capture_output=True,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(f"git cannot archive {commit} here: {done.stderr[-300:]!r}")
        out = tmp_path_factory.mktemp(f"embedcache-{commit}")
        with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
            tar.extractall(out, filter="data")
        trees[version] = out
        return out

    return get


@pytest.mark.parametrize("version", VERSIONS)
def test_the_old_embedcache_reads_every_unflipped_key_after_a_kill(
    killed, old_embedcache, tmp_path, version
):
    """One old embedcache process reads the store killed at each point: every
    key not flipped serves each row with its vector, a flipped key is refused."""
    stores = [killed(version, point, tmp_path) for point in POINTS]
    path = os.pathsep.join([str(old_embedcache(version)), str(FIXTURES)])
    done = subprocess.run(
        [sys.executable, str(OLD_READER), str(version), *map(str, stores)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert done.returncode == 0, (done.stdout, done.stderr[-2000:])
    refused = sum(FLIPPED.values())
    assert done.stdout.split() == ["read", str(2 * len(POINTS) - refused), "refused", str(refused)]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("version", VERSIONS)
def test_a_migration_killed_at_every_write_is_finished_by_the_next_run(
    tmp_path, version
):
    """The long sweep: killed before each of its writes and deletes in turn."""
    done = run_worker(copied(tmp_path, version, "count"), "count")
    assert done.returncode == 0, done.stderr[-2000:]
    n = int(done.stdout.split()[-2])
    assert n > 10
    for k in range(1, n + 1):
        root = killed_at(copied(tmp_path, version, f"op-{k}"), f"op-{k}")
        assert_old_or_complete(root, version, tmp_path)
        assert_run_again_finishes(root, version)
        shutil.rmtree(root)
