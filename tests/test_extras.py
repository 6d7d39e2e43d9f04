"""Install by role: the module -> extra table agrees with pyproject, and a command whose
extra is missing says which one to install, in one line.

A missing extra is simulated in a fresh interpreter by an import hook that refuses the
extra's top module (as an uninstalled package would), so one environment tests them all.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from embedcache.extras import EXTRA_OF_MODULE

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXTRAS = PYPROJECT["project"]["optional-dependencies"]
# extras for working on embedcache (tests, the docs site), not roles of its users
DEV_GROUPS = set(PYPROJECT["tool"]["deptry"]["optional_dependencies_dev_groups"])
# installed for what they run, not imported (deptry's DEP002 ignores say the same)
NOT_IMPORTED = {"jupyterlab", "ipykernel"}
# roles without a command of their own: `all` and `dev` bundle, notebooks is `make lab`
COMMANDLESS = {"all", "notebooks", *DEV_GROUPS}


def _name(requirement: str) -> str:
    """``dask[distributed]>=2024.8`` -> ``dask``; normalised as packaging does."""
    name = re.match(r"[A-Za-z0-9._-]+", requirement).group(0)
    return re.sub(r"[-_.]+", "-", name).lower()


def _expanded(extra: str) -> set[str]:
    """The distributions an extra brings, following ``embedcache[...]`` references."""
    found = set()
    for req in EXTRAS[extra]:
        if _name(req) == "embedcache":
            for inner in re.search(r"\[(.*)\]", req).group(1).split(","):
                found |= _expanded(inner.strip())
        else:
            found.add(_name(req))
    return found


def test_every_table_module_comes_from_its_extra():
    dists = packages_distributions()
    wrong = {}
    for module, extra in EXTRA_OF_MODULE.items():
        providers = {_name(d) for d in dists.get(module, [])}
        if module == "distributed":  # Dask's own spelling: dask[distributed]
            providers.add("dask")
        if not providers & _expanded(extra):
            wrong[module] = (extra, sorted(providers))
    assert wrong == {}


def test_every_imported_distribution_of_an_extra_is_in_the_table():
    dists = packages_distributions()
    modules_of: dict[str, set[str]] = {}
    for module, names in dists.items():
        for dist in names:
            modules_of.setdefault(_name(dist), set()).add(module)
    modules_of["dask"] |= {"distributed"}
    missing = []
    for extra in set(EXTRAS) - {"all", *DEV_GROUPS}:
        for req in EXTRAS[extra]:
            dist = _name(req)
            if dist in {"embedcache", *NOT_IMPORTED}:
                continue
            if not modules_of.get(dist, set()) & set(EXTRA_OF_MODULE):
                missing.append(f"{extra}: {dist}")
    assert missing == []


def test_all_brings_every_role():
    roles = set(EXTRAS) - {"all", *DEV_GROUPS}
    assert _expanded("all") == set().union(*(_expanded(r) for r in roles))


# --- a missing extra, one command each ---------------------------------------------

_BLOCK = """
import sys
from importlib.abc import MetaPathFinder

class _Uninstalled(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _Uninstalled())
from embedcache.cli import main
sys.exit(main(sys.argv[1:]))
"""

EMBED = ["embed", "--input", "{tmp}/in.txt", "--output", "{tmp}/out.npy"]
EMBED += ["--store", "{tmp}/store"]
# (extra, the module refused, the command)
COMMANDS = [
    ("models", "torch", [*EMBED, "--model", "caduceus-tiny", "--random-init", "0"]),
    ("serve", "fastapi", ["serve", "--model", "kmer-4", "--store", "{tmp}/store"]),
    ("cluster", "distributed", [*EMBED, "--model", "kmer-4", "--cluster", "local:1"]),
    ("report", "papermill", ["report", "--version", "demo-v1", "--store", "{tmp}/st"]),
    ("client", "httpx", [*EMBED[:5], "--model", "kmer-4", "--server", "http://x"]),
]


def test_every_role_with_a_command_is_tried():
    assert {extra for extra, _, _ in COMMANDS} == set(EXTRAS) - COMMANDLESS


@pytest.mark.parametrize(
    ("extra", "blocked", "args"), COMMANDS, ids=[c[0] for c in COMMANDS]
)
def test_a_missing_extra_is_one_line_naming_the_command_and_the_fix(
    tmp_path, extra, blocked, args
):
    (tmp_path / "in.txt").write_text("ACGTACGTAA\nGGGCCCATAT\n")
    argv = [a.format(tmp=tmp_path) for a in args]
    done = subprocess.run(
        [sys.executable, "-c", _BLOCK.format(blocked=blocked), *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    expected = (
        f"embedcache: error: embedcache {argv[0]} needs {blocked}, which is not "
        f"installed; install it with: pip install 'embedcache[{extra}]'"
    )
    # log lines may come first (INFO); the error is one line, and the last
    assert done.stderr.strip().splitlines()[-1] == expected
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out.npy").exists()


def test_the_notebook_api_names_the_extra_too(tmp_path):
    code = _BLOCK.format(blocked="sklearn").split("from embedcache.cli")[0] + (
        "import embedcache\n"
        "try:\n"
        "    embedcache.evaluate\n"
        "except ImportError as err:\n"
        "    print(type(err).__name__, err)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
        check=True,
    )
    assert done.stdout.strip() == (
        "MissingExtraError embedcache.evaluate needs sklearn, which is not installed; "
        "install it with: pip install 'embedcache[report]'"
    )


def test_a_missing_module_of_no_extra_keeps_its_traceback():
    from embedcache.extras import missing_extra

    assert missing_extra(ModuleNotFoundError("x", name="no_such"), what="x") is None


def test_the_core_contract_forbids_every_library_of_an_extra():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]
    (core,) = [
        c for c in config["importlinter"]["contracts"] if c["id"] == "core-stages"
    ]
    assert sorted(core["forbidden_modules"]) == sorted(EXTRA_OF_MODULE)
