from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from embedcache.cli import _kernel_cache_env
from embedcache.models.shared.jitcache import (
    COMPILE_MESSAGE,
    CompileNotice,
    default_cache_dir,
)

ROOT = Path(__file__).resolve().parents[2]

KERNELS = """
import numba


@numba.njit(cache=True)
def add(a, b):
    return a + b
"""

RUN = """
import logging
import sys

logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
import toykernels
from embedcache.models.shared.jitcache import CompileNotice

notice = CompileNotice(modules=["toykernels"], what="toy kernels", seconds="1 s")
with notice.watch():
    toykernels.add(1, 2)
    toykernels.add(1.5, 2.5)  # a second signature: compiled too, announced once
print(sum(toykernels.add.stats.cache_hits.values()),
      sum(toykernels.add.stats.cache_misses.values()))
"""


def test_default_cache_dir_follows_xdg(tmp_path):
    home = tmp_path / "home"
    assert default_cache_dir(xdg_cache_home=None, home=home) == (
        home / ".cache" / "embedcache" / "numba"
    )
    assert default_cache_dir(xdg_cache_home=str(tmp_path / "x"), home=home) == (
        tmp_path / "x" / "embedcache" / "numba"
    )
    # the XDG spec: a relative path is invalid and ignored
    assert default_cache_dir(xdg_cache_home="rel/dir", home=home) == (
        home / ".cache" / "embedcache" / "numba"
    )


def test_cli_points_numba_at_the_user_cache_for_one_command(monkeypatch, tmp_path):
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    with _kernel_cache_env():
        want = tmp_path / "xdg" / "embedcache" / "numba"
        assert os.environ["NUMBA_CACHE_DIR"] == str(want)
        assert want.is_dir()
    assert "NUMBA_CACHE_DIR" not in os.environ  # restored after the command


def test_cli_keeps_a_numba_cache_dir_the_user_set(monkeypatch, tmp_path):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    with _kernel_cache_env():
        assert os.environ["NUMBA_CACHE_DIR"] == str(tmp_path / "mine")
    assert os.environ["NUMBA_CACHE_DIR"] == str(tmp_path / "mine")
    assert not (tmp_path / "xdg").exists()


def test_cli_leaves_numba_its_defaults_when_the_cache_dir_cannot_be_made(
    monkeypatch, tmp_path
):
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    with _kernel_cache_env():
        assert "NUMBA_CACHE_DIR" not in os.environ


def _run(script: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )


def test_second_process_loads_kernels_from_the_cache_silently(tmp_path):
    (tmp_path / "toykernels.py").write_text(KERNELS)
    script = tmp_path / "run.py"
    script.write_text(RUN)
    cache = tmp_path / "numba-cache"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]),
        "NUMBA_CACHE_DIR": str(cache),
    }
    first = _run(script, env)
    assert first.stderr.count(COMPILE_MESSAGE) == 1
    assert "toy kernels: compiling kernels, once per machine" in first.stderr
    assert str(cache) in first.stderr  # says where the cache is
    assert first.stdout.split() == ["0", "2"]  # two signatures compiled
    assert list(cache.rglob("*.nbi"))  # the index landed in NUMBA_CACHE_DIR
    assert not (tmp_path / "__pycache__").exists() or not list(
        (tmp_path / "__pycache__").glob("*.nbi")
    )
    second = _run(script, env)
    assert COMPILE_MESSAGE not in second.stderr
    assert second.stdout.split() == ["2", "0"]  # both loaded, nothing compiled


def test_notice_ignores_other_modules_and_speaks_once():
    notice = CompileNotice(
        modules=["embedcache.models.families.caduceus.kernels"], what="x"
    )

    class Disp:
        def __init__(self, module):
            self.py_func = type("F", (), {"__module__": module})()

    notice.on_compile(Disp("somebody.else"))
    assert not notice.said
    notice.on_compile(Disp("embedcache.models.families.caduceus.kernels"))
    assert notice.said


CADUCEUS = ROOT / "tests" / "fixtures" / "caduceus" / "ph"


@pytest.mark.slow
def test_caduceus_cli_compiles_once_then_reuses_the_user_cache(tmp_path):
    """Two `embedcache embed` processes: the first compiles and says so, the second loads."""
    seqs = tmp_path / "seqs.txt"
    seqs.write_text("ACGTACGTAC\nGGGCCCAAATTT\n")
    env = {k: v for k, v in os.environ.items() if k not in {"NUMBA_CACHE_DIR"}} | {
        "PYTHONPATH": str(ROOT),
        "XDG_CACHE_HOME": str(tmp_path / "xdg"),
    }
    in_tree = ROOT / "embedcache" / "models" / "__pycache__"

    def in_tree_index() -> dict[str, float]:
        return {p.name: p.stat().st_mtime for p in in_tree.glob("*.nbi")}

    before = in_tree_index()
    runs = []
    for i in (1, 2):
        runs.append(
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "embedcache.cli",
                    "embed",
                    "--model",
                    str(CADUCEUS),
                    "--input",
                    str(seqs),
                    "--output",
                    str(tmp_path / f"out{i}.npy"),
                    "--store",
                    str(tmp_path / f"store{i}"),  # a fresh store: the model must run
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=900,
                check=True,
            )
        )
    assert runs[0].stderr.count(COMPILE_MESSAGE) == 1
    assert COMPILE_MESSAGE not in runs[1].stderr
    assert runs[1].stdout.strip().endswith("computed=2 cached=0")
    cache = tmp_path / "xdg" / "embedcache" / "numba"
    assert list(cache.rglob("*.nbi"))
    assert in_tree_index() == before  # nothing written beside the package
    # compiled or loaded, the same kernels (threaded sums may differ in the last bits)
    np.testing.assert_allclose(
        np.load(tmp_path / "out1.npy"), np.load(tmp_path / "out2.npy"), atol=1e-5
    )
