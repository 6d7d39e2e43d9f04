"""A real `embedcache serve` in a subprocess on 127.0.0.1 (a free port), tiny models."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def random_seqs(n, *, seed, low=20, high=60):
    rng = np.random.default_rng(seed)
    return [
        "".join(rng.choice(list("ACGT"), size=rng.integers(low, high)))
        for _ in range(n)
    ]


def cli_env():
    env = dict(os.environ)
    # the worktree's code wins over the editable install, also in the subprocess
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.pop("EMBEDCACHE_STORE", None)
    return env


def run_cli(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "embedcache.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=timeout,
        check=False,
    )


class Server:
    """One `embedcache serve` process: its URL, log, and how to stop it."""

    def __init__(
        self,
        args,
        *,
        log_path,
        key=None,
        scheme="http",
        verify=True,
        env=None,
        module="embedcache.cli",
        ready_s=90,
    ):
        self.port = free_port()
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self.verify = verify
        self.log_path = Path(log_path)
        self.key = key
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                module,
                "serve",
                "--port",
                str(self.port),
                *map(str, args),
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**cli_env(), **(env or {})},
        )
        self._wait_ready(ready_s)

    @property
    def headers(self):
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def client(self, **kwargs):
        return httpx.Client(
            base_url=self.url, headers=self.headers, timeout=60, **kwargs
        )

    def log(self):
        return self.log_path.read_text()

    def _wait_ready(self, timeout=90):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"server exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if (
                    httpx.get(
                        f"{self.url}/health/ready", timeout=1, verify=self.verify
                    ).status_code
                    == 200
                ):
                    return
            time.sleep(0.1)
        self.stop()
        pytest.fail(f"server not ready after {timeout} s:\n{self.log()}")

    def metric(self, name, model=None):
        """A counter or gauge's value from /metrics (0 when absent)."""
        text = httpx.get(f"{self.url}/metrics", headers=self.headers).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and (model is None or f'model="{model}"' in line):
                head, value = line.rsplit(" ", 1)
                if head.split("{")[0] == name:
                    total += float(value)
        return total

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_bert_dir):
    """kmer-4 and a tiny random BERT on one store, with small limits for the 413s."""
    tmp = tmp_path_factory.mktemp("serve")
    server = Server(
        [
            "--store",
            tmp / "store",
            "--model",
            "kmer-4",
            "--model",
            f"bert={tiny_bert_dir}",
            "--max-sequences",
            "2000",
            "--max-body-bytes",
            str(2**20),
            "--threads",
            "1",
            "--dtype",  # the key it reports, on any kind of CPU
            "float32",
        ],
        log_path=tmp / "server.log",
    )
    server.store = tmp / "store"
    server.bert_dir = tiny_bert_dir
    yield server
    assert server.stop() == 0, server.log()
    assert "Traceback" not in server.log()
