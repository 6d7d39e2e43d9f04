"""Light commands stay light: which heavy libraries each one imports (not a timing).

Each command runs in a fresh interpreter through :func:`embedcache.cli.main`, and the
interpreter then reports which heavy top-level modules are in ``sys.modules``. A
family's heavy modules load only when a model of that family does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fresh_python import fresh_python

REPO = Path(__file__).resolve().parents[2]
# never needed to list, inspect or embed with a built-in floor
HEAVY = ("torch", "transformers", "dask", "matplotlib", "sklearn", "fastapi", "uvicorn")

EMBED_KMER = ["embed", "--model", "kmer-4", "--input", "{input}", "--store", "{store}"]
EMBED_KMER += ["--output", "{store}.npy"]

_PROBE = """
import json, sys
{prelude}
from embedcache.cli import main
try:
    rc = main(sys.argv[1:])
except SystemExit as exit:
    rc = exit.code
heavy = sorted(m for m in {heavy!r} if m in sys.modules)
sys.stdout.write("\\nHEAVY " + json.dumps({{"rc": rc, "heavy": heavy}}) + "\\n")
"""


def heavy_modules(args: list[str], cwd: Path, *, prelude: str = "") -> dict:
    """Run ``embedcache ARGS`` in a fresh interpreter; its exit code and heavy imports."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(cwd)])}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(heavy=HEAVY, prelude=prelude), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
        check=False,
    )
    line = next((x for x in out.stdout.splitlines() if x.startswith("HEAVY ")), None)
    assert line is not None, f"{args}: no report\n{out.stdout}\n{out.stderr}"
    return json.loads(line[len("HEAVY ") :])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """Sequences and a store holding one kmer-4 key (so ``store ls`` lists something)."""
    from embedcache.cli import main

    root = tmp_path_factory.mktemp("startup")
    (root / "in.txt").write_text("ACGTACGTAA\nGGGCCCATAT\nTTTTACGCGA\n")
    args = ["embed", "--model", "kmer-3", "--input", str(root / "in.txt")]
    args += ["--store", str(root / "store"), "--output", str(root / "a.npy")]
    assert main(args) == 0
    return root


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["versions"],
        ["models"],
        ["store", "ls", "--store", "{store}"],
        EMBED_KMER,
    ],
    ids=["help", "versions", "models", "store-ls", "embed-kmer-4"],
)
def test_light_commands_import_no_heavy_library(args, workdir):
    seqs, store = workdir / "in.txt", workdir / "store"
    argv = [a.format(store=store, input=seqs) for a in args]
    report = heavy_modules(argv, workdir)
    assert report["rc"] in (0, None), report
    assert report["heavy"] == [], f"embedcache {' '.join(args)} imported {report}"


def test_the_probe_sees_a_heavy_import(tmp_path):
    # the check can fail: a heavy import before the command shows up in the report
    report = heavy_modules(["--help"], tmp_path, prelude="import torch")
    assert report["heavy"] == ["torch"]


def test_a_family_module_alone_does_not_import_torch():
    # `embedcache models` reads every family module's docstring: none may pull torch
    code = (
        "import sys\n"
        "from embedcache.models import FAMILY_MODULES, family_module\n"
        "for name in FAMILY_MODULES: family_module(name)\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    assert fresh_python(code) == "[]"


@pytest.mark.parametrize("family", ["ntv2", "bert"])
def test_a_transformer_family_loads_without_transformers(family, tiny_bert_dir):
    # NT-v2 tokenises itself and a plain BERT has its own network; neither imports
    # transformers, nor torch._dynamo and sympy (torch's meta-device init paths)
    folder = REPO / "tests" / "fixtures" / "ntv2" / "ntv2"
    folder = folder if family == "ntv2" else tiny_bert_dir
    code = (
        "import sys\n"
        "from embedcache.models import load_adapter\n"
        f"adapter = load_adapter({str(folder)!r}, device='cpu')\n"
        "assert adapter.embed_batch(['ACGTACGTAAN']).shape[0] == 1\n"
        "late = ('transformers', 'torch._dynamo', 'sympy')\n"
        "print(sorted(m for m in late if m in sys.modules))"
    )
    assert fresh_python(code).splitlines()[-1] == "[]"
