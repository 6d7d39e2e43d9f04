"""Store backends for the shared behaviour suite: a local folder, memory, and S3.

The S3 backend is moto's standalone server (``ThreadedMotoServer`` on 127.0.0.1),
started once per test session; each test gets its own bucket. Tests that need it
skip with the reason when it cannot start.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import obstore
import pytest
from obstore.store import MemoryStore

from embedcache.store import EmbeddingStore, open_object_store
from embedcache.store.backend import Backend

WORKER = Path(__file__).with_name("worker.py")
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


@dataclass
class StoreHandle:
    """One store location on one backend, and raw access to its objects."""

    kind: str  # "local" | "memory" | "s3"
    root: Any  # a folder path, a MemoryStore object, or an s3:// URL
    options: dict[str, str] | None = None

    def open(self, **kwargs: Any) -> EmbeddingStore:
        return EmbeddingStore(self.root, options=self.options, **kwargs)

    @property
    def raw(self) -> Any:
        if isinstance(self.root, MemoryStore):
            return self.root
        if self.kind == "local":
            Path(self.root).mkdir(parents=True, exist_ok=True)
        return open_object_store(self.root, self.options)

    def location(self, path: str) -> str:
        """How the store prints ``path`` (as in Fault.path and garbage())."""
        store = self.root if self.kind == "memory" else self.raw
        location = None if self.kind == "memory" else str(self.root).rstrip("/")
        return Backend(store, location=location).describe(path)

    def objects(self) -> dict[str, bytes]:
        raw = self.raw
        return {
            m["path"]: bytes(obstore.get(raw, m["path"]).bytes())
            for batch in obstore.list(raw)
            for m in batch
        }

    def paths(self, pattern: str) -> list[str]:
        return sorted(p for p in self.objects() if fnmatch.fnmatch(p, pattern))

    def read(self, path: str) -> bytes:
        return bytes(obstore.get(self.raw, path).bytes())

    def write(self, path: str, data: bytes) -> None:
        obstore.put(self.raw, path, data)

    def delete(self, path: str) -> None:
        obstore.delete(self.raw, path)

    def worker(self, *args: str) -> list[str]:
        """The command line of a writer subprocess on this store."""
        if self.kind == "memory":
            pytest.skip("a memory store lives in one process")
        opts = ["--options", json.dumps(self.options)] if self.options else []
        return [sys.executable, str(WORKER), str(self.root), *opts, *args]

    def run_worker(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.worker(*args), capture_output=True, text=True, check=True, timeout=180
        )


@pytest.fixture(scope="session")
def s3_endpoint():
    """http://127.0.0.1:<port> of a moto S3 server for this session."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as err:  # pragma: no cover - a dev dependency
        pytest.skip(f"moto[server] is not installed ({err})")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    try:
        server.start()
    except (OSError, RuntimeError) as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"the moto S3 server could not start ({err})")
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def s3_options(endpoint: str) -> dict[str, str]:
    return {
        **CREDENTIALS,
        "aws_region": "us-east-1",
        "aws_endpoint_url": endpoint,
        "aws_allow_http": "true",
    }


def new_bucket(endpoint: str) -> str:
    import boto3

    name = f"test-{secrets.token_hex(6)}"
    boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", **CREDENTIALS
    ).create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3_handle(request):
    endpoint = request.getfixturevalue("s3_endpoint")
    url = f"s3://{new_bucket(endpoint)}/embeddings"
    return StoreHandle("s3", url, s3_options(endpoint))


@pytest.fixture(params=["local", "memory", "s3"])
def handle(request, tmp_path):
    """A fresh store location on each backend."""
    if request.param == "local":
        return StoreHandle("local", str(tmp_path / "store"))
    if request.param == "memory":
        return StoreHandle("memory", MemoryStore())
    return request.getfixturevalue("s3_handle")


@pytest.fixture(params=["local", "s3"])
def process_handle(request, tmp_path):
    """A store location several processes can open: a folder, or S3."""
    if request.param == "local":
        return StoreHandle("local", str(tmp_path / "store"))
    return request.getfixturevalue("s3_handle")


@pytest.fixture
def world():
    """A shared in-memory bucket for simulated hosts, with faults (faulty_backend)."""
    from tests.store.faulty_backend import World, installed

    with installed():
        yield World()
