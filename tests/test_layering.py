"""The package's layering: imports only go down the data flow (docs/architecture.md).

Every module under embedcache/ is parsed with ``ast``; every import counts, at module
level, inside functions and under ``TYPE_CHECKING`` alike. ``embedcache/__init__.py``
is exempt: it is the lazy public API and names every floor. The public API itself is
checked here too: it resolves, and ``import embedcache`` stays light.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import embedcache

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "embedcache"
BOTTOM = frozenset({"errors", "hashing", "specs"})
# what each stage may import, besides itself and `from embedcache import __version__`
ALLOWED: dict[str, frozenset[str]] = {
    **dict.fromkeys(BOTTOM, frozenset()),
    "data": BOTTOM,
    "models": BOTTOM,
    "store": BOTTOM,
    "engine": BOTTOM | {"data", "models", "store"},
    "analysis": BOTTOM | {"data", "models", "store"},
    "report": BOTTOM | {"data", "models", "store", "engine", "analysis"},
    # the HTTP service fronts the engine; only cli (and the client's wire names) use it
    "service": BOTTOM | {"data", "models", "store", "engine"},
    # the service's Python client: the shared wire names, the package's own
    # sequence check and hash, the engine's .npy writer
    "client": BOTTOM | {"data", "engine", "service"},
}
STAGES = frozenset(ALLOWED) | {"cli"}
# (importing module, imported stage) pairs known to go up the flow, to be fixed in
# the files that hold them; must stay empty
KNOWN_VIOLATIONS: frozenset[tuple[str, str]] = frozenset()
HEAVY = ("torch", "polars", "numpy", "zarr", "dask")


def _stage(module: str) -> str:
    """``embedcache.analysis.probe`` -> ``analysis``; ``embedcache.errors`` -> ``errors``."""
    return module.split(".")[1]


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path, root: Path = ROOT) -> list[tuple[str, int]]:
    """Every embedcache module or stage ``path`` imports, with its line."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path, root)
    if path.name != "__init__.py":
        package = package.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base == "embedcache":
                # `from embedcache import store` names a stage; __version__ is free
                found += [
                    (f"embedcache.{a.name}", node.lineno)
                    for a in node.names
                    if a.name != "__version__"
                ]
            else:
                found.append((base, node.lineno))
    return [(m, line) for m, line in found if m.startswith("embedcache.")]


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p != PACKAGE / "__init__.py")


def _violations() -> list[str]:
    bad = []
    for path in _modules():
        name = _module_name(path)
        own = _stage(name)
        allowed = ALLOWED.get(own)
        if allowed is None:  # cli: anything
            continue
        for target, line in _imported(path):
            stage = _stage(target)
            if stage == own or stage in allowed:
                continue
            if (name, stage) in KNOWN_VIOLATIONS:
                continue
            rel = path.relative_to(ROOT)
            bad.append(f"{rel}:{line} ({own}) imports {target} ({stage})")
    return bad


def test_every_module_belongs_to_a_stage():
    stages = {_stage(_module_name(p)) for p in _modules()}
    assert stages <= STAGES, f"modules outside the known stages: {stages - STAGES}"


def test_imports_only_go_down_the_flow():
    bad = _violations()
    assert bad == [], "imports up the flow (see docs/architecture.md):\n" + "\n".join(
        bad
    )


def test_known_violations_list_is_empty():
    # a place to park a violation while another file is fixed; empty when merged
    assert not KNOWN_VIOLATIONS


def test_the_checker_sees_function_level_and_relative_imports(tmp_path):
    probe = tmp_path / "embedcache" / "data" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text(
        "from __future__ import annotations\n"
        "from embedcache import __version__, analysis\n"
        "from ..report import tables\n"
        "def f():\n"
        "    import embedcache.engine.embed\n"
    )
    found = {m for m, _ in _imported(probe, tmp_path)}
    assert found == {
        "embedcache.analysis",
        "embedcache.report",
        "embedcache.engine.embed",
    }


def test_import_embedcache_is_light():
    code = (
        "import embedcache, sys; "
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_public_api_is_declared_and_resolves_where_its_module_exists():
    assert "__version__" in embedcache.__all__
    assert "embed_into_store" in embedcache.__all__
    assert set(embedcache.__all__) <= set(dir(embedcache))
    assert set(embedcache.__all__) == {"__version__", *embedcache._LAZY}
    for name in embedcache.__all__:
        module = embedcache._LAZY.get(name, "embedcache").replace(".", "/")
        files = (ROOT / f"{module}.py", ROOT / module / "__init__.py")
        if not any(f.exists() for f in files):
            continue  # declared ahead of the module that defines it (being written)
        assert getattr(embedcache, name) is not None, name
    assert issubclass(embedcache.EmbedcacheError, Exception)


def test_unknown_attribute_raises_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = embedcache.no_such_name
