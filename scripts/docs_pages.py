"""The documentation's generated tables, and the mkdocs hook that puts them in pages.

A page asks for a table with a line ``<!-- generated: NAME -->``; the hook replaces
it with ``TABLES[NAME]()`` when mkdocs builds (``make docs``). Each table is made from
the code's own declarations, so a new setting, metric or model family shows up in the
site without editing a page:

- ``settings``: every field of :class:`~embedcache.service.settings.ServeSettings`
  with its type, default, limits, flag, serve.toml key and environment variable;
- ``model-table``: the keys of a serve.toml ``[[model]]`` table;
- ``metrics``: every metric of :class:`~embedcache.service.metrics.Metrics`;
- ``families``: the registry's families (``FAMILY_MODULES``), what each loads into, its
  options and the evidence of equality with its official code (``catalogue.toml``);
- ``checkpoints``: the checkpoints ``catalogue.toml`` lists, by family;
- ``import-contracts``: the import-linter contracts of pyproject.toml;
- ``benchmarks``: the benchmark records' page (``benchmarks/report.py``), its history
  plot added to the site beside it.
"""

from __future__ import annotations

import html
import re
import tempfile
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from annotated_types import Ge, Gt, Le, Lt

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from types import ModuleType

    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.structure.files import Files
    from pydantic import BaseModel
    from pydantic.fields import FieldInfo

    from embedcache.models.catalogue import CatalogueEntry, FamilyRecord
    from embedcache.service.metrics import Metrics

PLOT = "benchmarks-history.svg"  # beside benchmarks.md in the built site
ROOT_PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)
_BOUNDS = ((Ge, "ge", "≥"), (Gt, "gt", ">"), (Le, "le", "≤"), (Lt, "lt", "<"))


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A markdown table; ``|`` inside a cell is escaped."""
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for row in rows:
        cells = (str(cell).replace("|", "\\|").replace("\n", " ") for cell in row)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def code(text: str) -> str:
    """``text`` as inline code that a table cell keeps whole: HTML, its pipes as
    entities (a backslash-escaped pipe would show its backslash inside backticks)."""
    return f"<code>{html.escape(text).replace('|', '&#124;')}</code>"


def type_name(annotation: Any) -> str:  # noqa: ANN401 (any annotation)
    """``int``, ``str | None``, ``list[ModelTable]``: an annotation as one reads it."""
    if isinstance(annotation, type) and not getattr(annotation, "__args__", None):
        return annotation.__name__
    return re.sub(r"\b[\w.]+\.(\w+)", r"\1", str(annotation)).replace("typing.", "")


def shown_default(info: FieldInfo) -> str:
    """The default as a user writes it; byte and token counts also in Mi."""
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int) and value >= 2**20 and value % 2**20 == 0:
        return f"{value:,} ({value // 2**20} Mi)"
    if isinstance(value, list | tuple | dict) and not value:
        return "none"
    return str(value)


def limits(info: FieldInfo) -> str:
    """The field's bounds (``≥ 1``, ``≥ 0, ≤ 65535``), or ``min_length``."""
    found = []
    for item in info.metadata:
        for kind, attr, sign in _BOUNDS:
            if isinstance(item, kind):
                found.append(f"{sign} {getattr(item, attr)}")
        if hasattr(item, "min_length") and item.min_length is not None:
            found.append(f"length ≥ {item.min_length}")
    return ", ".join(found)


def settings_table(settings_cls: type[BaseModel], *, env_prefix: str) -> str:
    """One row per field of a settings model: the server's settings reference. The
    setting's name is its serve.toml key (a list of models: ``[[name]]`` tables)."""
    rows = []
    for name, info in settings_cls.model_fields.items():
        tables = type_name(info.annotation).startswith("list[")
        rows.append(
            (
                code(name) + (f" ({code(f'[[{name}]]')} tables)" if tables else ""),
                code(type_name(info.annotation)),
                code(shown_default(info)),
                limits(info),
                code("--" + name.replace("_", "-")),
                code(f"{env_prefix}{name.upper()}"),
                info.description or "",
            )
        )
    header = (
        "setting (serve.toml key)",
        "type",
        "default",
        "limits",
        "flag",
        "variable",
        "what it does",
    )
    return markdown_table(header, rows)


def table_keys(model_cls: type[BaseModel]) -> str:
    """One row per key of a TOML table declared by a pydantic model."""
    rows = (
        (
            code(name),
            code(type_name(info.annotation)),
            code(shown_default(info)),
            limits(info),
        )
        for name, info in model_cls.model_fields.items()
    )
    return markdown_table(("key", "type", "default", "limits"), rows)


def metrics_table(metrics: Metrics) -> str:
    """One row per metric a server exposes at ``/metrics``, from its registry."""
    labels = {
        getattr(m, "_name", None): tuple(getattr(m, "_labelnames", ()))
        for m in vars(metrics).values()
    }
    rows = []
    for family in metrics.registry.collect():
        exposed = family.name + ("_total" if family.type == "counter" else "")
        rows.append(
            (
                code(exposed),
                family.type,
                ", ".join(code(label) for label in labels.get(family.name, ())),
                family.documentation,
            )
        )
    return markdown_table(("metric", "type", "labels", "what it counts"), rows)


def families_table(
    modules: Sequence[ModuleType], records: Mapping[str, FamilyRecord]
) -> str:
    """One row per family module, in the order a config is tried: what it loads
    into, its options and the evidence of equality with its official code."""
    rows = []
    for module in modules:
        record = records.get(module.FAMILY)
        options = getattr(module, "FAMILY_OPTIONS", {})
        rows.append(
            (
                code(module.FAMILY),
                (module.__doc__ or "").strip().splitlines()[0].replace("``", "`"),
                record.loaded_into if record else "not recorded",
                "<br>".join(
                    code(f"--family-option {k}={'|'.join(v)}")
                    for k, v in options.items()
                ),
                record.equality if record else "not recorded",
            )
        )
    header = (
        "family",
        "what it is",
        "loaded into",
        "family options",
        "evidence of equality with the official code",
    )
    return markdown_table(header, rows)


def checkpoints_table(
    modules: Sequence[ModuleType], entries: Sequence[CatalogueEntry]
) -> str:
    """One row per catalogued checkpoint, grouped by family in the order a config
    is tried."""
    order = [module.FAMILY for module in modules]
    rows = [
        (
            code(e.hub_id),
            code(e.family),
            e.params,
            f"{e.context:,}",
            e.rc_default,
            e.licence,
        )
        for e in sorted(entries, key=lambda e: (order.index(e.family), e.hub_id))
    ]
    header = ("checkpoint", "family", "parameters", "context", "RC default", "licence")
    return markdown_table(header, rows)


def contracts_table(importlinter: Mapping[str, Any]) -> str:
    """One row per import-linter contract (``[tool.importlinter]`` of pyproject.toml)."""
    rows = []
    for contract in importlinter.get("contracts", []):
        if contract["type"] == "layers":
            rule = " > ".join(code(layer) for layer in contract["layers"])
        else:
            sources = ", ".join(code(m) for m in contract["source_modules"])
            banned = ", ".join(code(m) for m in contract["forbidden_modules"])
            rule = f"{sources} never imports {banned}"
        rows.append((code(contract["id"]), contract["name"], contract["type"], rule))
    return markdown_table(("contract", "says", "kind", "rule"), rows)


def _settings() -> str:
    from embedcache.service.settings import ENV_PREFIX, ServeSettings

    return settings_table(ServeSettings, env_prefix=ENV_PREFIX)


def _model_table() -> str:
    from embedcache.service.settings import ModelTable

    return table_keys(ModelTable)


def _metrics() -> str:
    from embedcache.service.metrics import Metrics

    return metrics_table(Metrics())


def _family_modules() -> list[ModuleType]:
    from embedcache.models.registry import FAMILY_MODULES, family_module

    return [family_module(name) for name in FAMILY_MODULES]


def _families() -> str:
    from embedcache.models.catalogue import load_family_records

    return families_table(_family_modules(), load_family_records())


def _checkpoints() -> str:
    from embedcache.models.catalogue import load_catalogue

    return checkpoints_table(_family_modules(), load_catalogue())


def _contracts() -> str:
    config = tomllib.loads(ROOT_PYPROJECT.read_text("utf-8"))
    return contracts_table(config["tool"]["importlinter"])


def _benchmarks() -> str:
    from benchmarks.records import load_records
    from benchmarks.report import render_benchmarks_page

    # the page's own title line is the docs page's; the rest is the records' page
    page = render_benchmarks_page(load_records(), plot=PLOT)
    return page.split("\n", 1)[1]


TABLES: dict[str, Callable[[], str]] = {
    "settings": _settings,
    "model-table": _model_table,
    "metrics": _metrics,
    "families": _families,
    "checkpoints": _checkpoints,
    "import-contracts": _contracts,
    "benchmarks": _benchmarks,
}


def fill(markdown: str, tables: Mapping[str, Callable[[], str]] = TABLES) -> str:
    """``markdown`` with every ``<!-- generated: NAME -->`` line replaced by its table.

    Raises
    ------
    KeyError
        A marker names no table.
    """

    def table(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in tables:
            msg = (
                f"<!-- generated: {name} -->: no such table; known are {sorted(tables)}"
            )
            raise KeyError(msg)
        return tables[name]()

    return MARKER.sub(table, markdown)


def on_page_markdown(markdown: str, **_: object) -> str:
    """mkdocs hook: fill a page's generated tables."""
    return fill(markdown)


def on_files(files: Files, *, config: MkDocsConfig) -> Files:
    """mkdocs hook: the benchmarks page's history plot, drawn from the records."""
    from mkdocs.structure.files import File

    from benchmarks.records import load_records
    from benchmarks.report import write_history_plot

    with tempfile.TemporaryDirectory() as tmp:
        svg = write_history_plot(load_records(), Path(tmp) / PLOT).read_bytes()
    files.append(File.generated(config, PLOT, content=svg))
    return files
