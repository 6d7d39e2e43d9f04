"""What the import rule's tool cannot check: the public API at run time.

The layering itself (docs/architecture.md, "The import rule") is import-linter's:
``make lint`` runs the contracts in pyproject.toml, which see every import, at module
level, inside functions and under ``TYPE_CHECKING``. What import-linter cannot tell is
when an import runs, so that ``import embedcache`` stays light (the lazy names load
on first use) is checked here, in a fresh interpreter.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import embedcache

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "polars", "numpy", "zarr", "dask")


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
