"""What the import rule's tool cannot check: the public API at run time.

The layering itself (docs/architecture.md, "The import rule") is import-linter's:
``make lint`` runs the contracts in pyproject.toml, which see every import, at module
level, inside functions and under ``TYPE_CHECKING``. What import-linter cannot tell is
when an import runs, so that ``import embedcache`` stays light (the lazy names load
on first use) is checked here, in a fresh interpreter.
"""

from __future__ import annotations

import ast
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


# --- no import circles ------------------------------------------------------------------


def _module_files() -> dict[str, Path]:
    """Dotted name -> file of every module of the package (a package by its
    ``__init__.py``)."""
    found = {}
    for path in (ROOT / "embedcache").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(tree: ast.AST, *, skip_type_checking: bool):
    """Every import statement in ``tree``: at module level, in functions and classes,
    and under ``TYPE_CHECKING`` (unless skipped)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif not (skip_type_checking and _is_type_checking(node)):
            yield from _imports(node, skip_type_checking=skip_type_checking)


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {package module it imports: line of the first such import}.

    ``from pkg import name`` counts as importing ``pkg.name`` where that is a module,
    else ``pkg`` itself. The package root's ``TYPE_CHECKING`` block is left out: it
    only names the lazily loaded public API for type checkers (the root knows every
    floor by design; the names load on first use, tests above)."""
    files = _module_files()

    def owner(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, int]] = {}
    for module, path in files.items():
        here = (
            module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        )
        edges: dict[str, int] = {}
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in _imports(tree, skip_type_checking=module == "embedcache"):
            if isinstance(node, ast.Import):
                targets = [owner(a.name) for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    prefix = here[: len(here) - node.level + 1]
                    base = ".".join([*prefix, *([base] if base else [])])
                targets = [owner(f"{base}.{a.name}") or owner(base) for a in node.names]
            for target in targets:
                if target and target != module:
                    edges.setdefault(target, node.lineno)
        graph[module] = edges
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or round a longer
    circle (strongly connected components of more than one module), each sorted."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        order[node] = low[node] = len(order)
        stack.append(node)
        for nxt in graph.get(node, {}):
            if nxt not in order:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], order[nxt])
        if low[node] == order[node]:
            group = []
            while (popped := stack.pop()) != node:
                group.append(popped)
            if group:
                cycles.append(sorted([node, *group]))

    for node in sorted(graph):
        if node not in order:
            visit(node)
    return sorted(cycles)


def test_import_cycles_are_found_round_any_circle():
    graph = {
        "a": {"b": 1},
        "b": {"c": 2},
        "c": {"a": 3},
        "d": {"e": 4},
        "e": {"d": 5, "a": 6},
        "f": {"a": 7},
    }
    assert import_cycles(graph) == [["a", "b", "c"], ["d", "e"]]
    assert import_cycles({"a": {"b": 1}, "b": {}}) == []


def test_the_graph_sees_function_level_and_type_checking_imports():
    graph = import_graph()
    # an import inside a function: the registry loads the k-mer floor on first use
    assert "embedcache.models.floors.kmer" in graph["embedcache.models.registry"]
    # `from embedcache.store import merges` is the submodule, not the package
    assert "embedcache.store.merges" in graph["embedcache.store.embedding_store"]
    # a TYPE_CHECKING import counts (it ties the files as much as any)
    assert "embedcache.analysis.selection" in graph["embedcache.analysis.results"]


def test_no_two_package_modules_import_each_other():
    graph = import_graph()
    problems = []
    for group in import_cycles(graph):
        ring = [
            f"  {a} imports {b} (line {graph[a][b]})"
            for a in group
            for b in group
            if b in graph[a]
        ]
        problems.append(f"{' <-> '.join(group)}:\n" + "\n".join(ring))
    assert not problems, (
        "package modules that import each other (move what both need to the module "
        "below them):\n" + "\n".join(problems)
    )
