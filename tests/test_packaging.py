"""The wheel is the product: built from the sdist, it carries every file the package
reads; installed with only ``[client]`` into a fresh venv (no torch) it calls a running
server; installed with ``[all]`` it runs ``embedcache demo`` offline (slow: .ci/run).

Fresh venvs install from the package index like a user's would, with the project's
constraints file (torch's CPU wheel).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from embedcache.analysis.results import RESULT_COLUMNS
from tests.service.conftest import Server

ROOT = Path(__file__).resolve().parents[1]
# never imported by the client, whether installed or not
HEAVY = ("torch", "transformers", "numba", "polars", "dask", "distributed", "fastapi")


def run(args: list, **kwargs: object) -> subprocess.CompletedProcess:
    """Run ``args``; a failure shows what the child printed."""
    done = subprocess.run(args, capture_output=True, text=True, check=False, **kwargs)
    assert done.returncode == 0, (
        f"{args}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """``python -m build``: an sdist, and the wheel built from it."""
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--outdir", out, ROOT], timeout=600)
    assert len(list(out.glob("embedcache-*.tar.gz"))) == 1
    (found,) = out.glob("embedcache-*.whl")
    return found


def fresh_venv(where: Path, requirement: str) -> Path:
    """A new venv with ``requirement`` installed; its python."""
    run([sys.executable, "-m", "venv", where])
    python = where / "bin" / "python"
    pip = [python, "-m", "pip", "install", "-q", "-c", ROOT / "constraints.txt"]
    run([*pip, requirement], timeout=1800)
    return python


def venv_env(python: Path, home: Path) -> dict[str, str]:
    """An environment as an activated venv has it, away from this checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDCACHE_")}
    env.pop("PYTHONPATH", None)
    env["PATH"] = f"{python.parent}{os.pathsep}{env['PATH']}"
    env["HOME"] = str(home)
    env["HF_HUB_OFFLINE"] = "1"
    env["HF_HOME"] = str(home / "hf")
    return env


def test_the_wheel_holds_every_file_of_the_package(wheel):
    git = ["git", "ls-files", "embedcache"]
    tracked = subprocess.check_output(git, cwd=ROOT, text=True).split()
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [
        path for path in tracked if Path(ROOT, path).exists() and path not in names
    ]
    assert missing == []
    # the report executes the leaderboard notebook: it ships inside the package
    assert "embedcache/report/notebooks/leaderboard.py" in names
    assert "embedcache/report/notebooks/explore.py" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".ipynb")]


_CLIENT = """
import json, sys
import numpy as np
from embedcache.client import EmbedClient

url, out = sys.argv[1], sys.argv[2]
with EmbedClient(url) as client:
    names = [m["id"] for m in client.models()]
    vectors = client.embed(["ACGTACGTAA", "GGGCCCATAT", "acgtacgtaa"], model="kmer-4")
np.save(out, vectors)
heavy = sorted(m for m in {heavy!r} if m in sys.modules)
print(json.dumps({{"heavy": heavy, "models": names}}))
"""

_CLI = """
import json, runpy, sys
sys.argv = ["embedcache", *sys.argv[1:]]
try:
    runpy.run_module("embedcache.cli", run_name="__main__")
except SystemExit as exit:
    code = exit.code
heavy = sorted(m for m in {heavy!r} if m in sys.modules)
print("HEAVY " + json.dumps({{"rc": code, "heavy": heavy}}))
"""


def test_the_client_extra_alone_calls_a_server(wheel, tmp_path):
    python = fresh_venv(tmp_path / "venv", f"{wheel}[client]")
    env = venv_env(python, tmp_path)
    find_torch = "import importlib.util as u; print(u.find_spec('torch'))"
    not_installed = run([python, "-c", find_torch], env=env)
    assert not_installed.stdout.strip() == "None"

    server = Server(
        ["--store", tmp_path / "store", "--model", "kmer-4"],
        log_path=tmp_path / "server.log",
    )
    try:
        api = run(
            [python, "-c", _CLIENT.format(heavy=HEAVY), server.url, "a.npy"],
            env=env,
            cwd=tmp_path,
            timeout=120,
        )
        (tmp_path / "in.txt").write_text("ACGTACGTAA\nGGGCCCATAT\nTTTTACGCGA\n")
        embed = ["embed", "--model", "kmer-4", "--input", "in.txt"]
        embed += ["--output", "b.npy", "--server", server.url]
        cli = run(
            [python, "-c", _CLI.format(heavy=HEAVY), *embed],
            env=env,
            cwd=tmp_path,
            timeout=120,
        )
    finally:
        assert server.stop() == 0, server.log()
    assert json.loads(api.stdout) == {"heavy": [], "models": ["kmer-4"]}
    lines = cli.stdout.splitlines()
    assert json.loads(lines[-1].removeprefix("HEAVY ")) == {"rc": 0, "heavy": []}
    assert lines[-2] == "computed=1 cached=2"

    # the vectors are kmer-4's, as this checkout computes them
    from embedcache.models import load_adapter

    kmer = load_adapter("kmer-4")
    a, b = np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy")
    expected = kmer.embed_batch(["ACGTACGTAA", "GGGCCCATAT", "TTTTACGCGA"])
    np.testing.assert_array_equal(a, expected[[0, 1, 0]])
    np.testing.assert_array_equal(b, expected)


@pytest.mark.slow
def test_the_all_extra_runs_the_demo_offline_and_renders_its_report(wheel, tmp_path):
    python = fresh_venv(tmp_path / "venv", f"{wheel}[all]")
    env = venv_env(python, tmp_path)
    work = tmp_path / "work"  # no notebooks/ or pyproject anywhere above it
    work.mkdir()
    run(
        [python.parent / "embedcache", "demo", "--store", "store"],
        env=env,
        cwd=work,
        timeout=1800,
    )
    html = (work / "reports" / "demo-v1" / "index.html").read_text()
    assert "Leaderboard" in html
    assert 'src="data:image/png;base64,' in html
    results = (work / "reports" / "demo-v1" / "results.csv").read_text()
    assert results.splitlines()[0] == ",".join(RESULT_COLUMNS)
    assert ",kmer-4," in results
    assert "caduceus-tiny (random init 0" in results  # the neural control row
