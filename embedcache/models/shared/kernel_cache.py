"""Compiled kernels go stale with the code they import, not only their own file.

numba's cache (``cache=True``) keeps a kernel's machine code until the source file
that defines it changes. A kernel built from another module's pieces (the Caduceus
scan from :mod:`.caduceus.simd`'s vector IR, HyenaDNA's kernels from Caduceus's exp)
would keep running the old pieces after an edit or a ``git pull`` that touches only
them. A module that calls :func:`track` has its kernels' cache stamp cover the files
it imports from at module level (where all a kernel can reach), followed through
the imports of those that are embedcache's own.

A locator put first in numba's list (``CacheImpl._locator_classes``) wraps the one
numba would pick: the cache path stays numba's, only the stamp is longer. A user's
``NUMBA_CACHE_LOCATOR_CLASSES`` replaces the whole list, this locator too.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
from functools import cache
from pathlib import Path
from typing import Any

from numba.core import caching

_TRACKED: set[str] = set()
_OWN_PACKAGE = "embedcache"


def track(module: str) -> None:
    """Let the kernels of ``module`` (its ``__name__``, before they are defined) go
    stale with the sources it imports."""
    _TRACKED.add(module)
    if _ImportsLocator not in caching.CacheImpl._locator_classes:  # numba's list
        caching.CacheImpl._locator_classes.insert(0, _ImportsLocator)


class _ImportsLocator:
    """numba's own locator for a tracked module's function, its stamp extended by a
    digest of the sources the module imports."""

    def __init__(self, inner: Any, module: str, py_file: str) -> None:  # noqa: ANN401 (a numba locator)
        self._inner = inner
        self._module = module
        self._py_file = py_file  # numba's warnings name it

    def ensure_cache_path(self) -> None:
        self._inner.ensure_cache_path()

    def get_cache_path(self) -> str:
        return self._inner.get_cache_path()

    def get_source_stamp(self) -> tuple[Any, str]:
        return self._inner.get_source_stamp(), imports_digest(self._module)

    def get_disambiguator(self) -> str:
        return self._inner.get_disambiguator()

    @classmethod
    def from_function(cls, py_func: Any, py_file: str) -> _ImportsLocator | None:  # noqa: ANN401
        module = py_func.__module__
        if module not in _TRACKED:
            return None
        for locator_class in caching.CacheImpl._locator_classes:
            if locator_class is cls:
                continue
            inner = locator_class.from_function(py_func, py_file)
            if inner is not None:
                return cls(inner, module, py_file)
        return None


@cache
def imports_digest(module: str) -> str:
    """sha256 over the sources ``module`` imports at module level, and theirs in
    turn where they are embedcache's (the module's own file apart)."""
    digest = hashlib.sha256()
    for path in sorted(_imported_sources(module, set())):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _imported_sources(module: str, seen: set[str]) -> set[Path]:
    seen.add(module)
    found: set[Path] = set()
    for name in _module_level_imports(_source_of(module)):
        if name in seen:
            continue
        path = _source_of(name)
        if path is None:
            continue
        found.add(path)
        found |= _imported_sources(name, seen)
    return found


def _tracked_packages() -> set[str]:
    """Packages whose imports are followed: embedcache's and the tracked modules'."""
    return {_OWN_PACKAGE} | {name.partition(".")[0] for name in _TRACKED}


def _source_of(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


def _module_level_imports(path: Path | None) -> list[str]:
    """Modules a file imports at its top level (``from a import b``: ``a.b`` when
    that is a module, else ``a``), in the tracked packages. A kernel reaches only
    module-level names; the kernel modules import nothing under an ``if`` but
    ``TYPE_CHECKING`` names, which are skipped with it."""
    if path is None:
        return []
    packages, names = _tracked_packages(), []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module.partition(".")[0] not in packages:
                continue
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                names.append(sub if _is_module(sub) else node.module)
    return [name for name in names if name.partition(".")[0] in packages]


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False
