"""A cached numba kernel goes stale with the modules it imports (``kernel_cache.track``),
as the Caduceus scan does with its vector IR in other files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import embedcache

HELPER = """
import numba

@numba.njit(inline="always")
def value():
    return {value}
"""
KERNEL = """
import numba
{track}
from pieces.helper import value

@numba.njit(cache=True)
def kernel():
    return value()

print(kernel(), sum(kernel.stats.cache_hits.values()))
"""
TRACK = (
    "from embedcache.models.shared import kernel_cache\nkernel_cache.track(__name__)"
)


def run(root: Path, module: str) -> tuple[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(root), str(Path(embedcache.__file__).parents[1])]
        ),
        "NUMBA_CACHE_DIR": str(root / "numba-cache"),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", f"import pieces.{module}"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    value, hits = done.stdout.split()
    return value, hits


def test_an_edit_to_an_imported_module_recompiles_a_tracked_kernel(tmp_path):
    package = tmp_path / "pieces"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helper.py").write_text(HELPER.format(value=1))
    (package / "tracked.py").write_text(KERNEL.format(track=TRACK))
    (package / "untracked.py").write_text(KERNEL.format(track=""))

    assert run(tmp_path, "tracked") == ("1", "0")  # compiled
    assert run(tmp_path, "tracked") == ("1", "1")  # loaded from the cache
    assert run(tmp_path, "untracked") == ("1", "0")

    (package / "helper.py").write_text(HELPER.format(value=2))
    assert run(tmp_path, "tracked") == ("2", "0")  # the edit recompiled it
    assert run(tmp_path, "tracked") == ("2", "1")
    # numba alone keys the cache on the kernel's own file: the old machine code
    assert run(tmp_path, "untracked") == ("1", "1")
