"""The docs' generated tables follow the code: a new setting, metric or model family
gets its row without a page being edited (scripts/docs_pages.py)."""

from __future__ import annotations

import dataclasses
import html
import re
import types

import pytest
from prometheus_client import Gauge
from pydantic import Field

from embedcache.models.catalogue import (
    FamilyRecord,
    load_catalogue,
    load_family_records,
)
from embedcache.models.registry import FAMILY_MODULES, family_module
from embedcache.service.metrics import Metrics
from embedcache.service.settings import ENV_PREFIX, ServeSettings
from scripts.docs_pages import (
    checkpoints_table,
    families_table,
    fill,
    metrics_table,
    settings_table,
)


def rows(table: str) -> list[list[str]]:
    """The body rows of a markdown table, cells stripped, inline code as `text`."""
    body = table.splitlines()[2:]
    cells = [line.strip("|").split(" | ") for line in body]
    return [[plain(c.strip()) for c in row] for row in cells]


def added_row(before: str, after: str) -> list[str]:
    """The one row ``after`` adds at the end of ``before`` (every other row the same)."""
    old, new = rows(before), rows(after)
    assert new[:-1] == old
    return new[-1]


def plain(cell: str) -> str:
    """A cell as one reads it: ``<code>a &#124; b</code>`` becomes `a | b`."""
    text = re.sub(r"<code>(.*?)</code>", r"`\1`", cell)
    return html.unescape(text.replace("&#124;", "|"))


def test_every_setting_has_one_row_with_its_flag_file_key_and_variable():
    table = rows(settings_table(ServeSettings, env_prefix=ENV_PREFIX))
    assert [r[0].split()[0] for r in table] == [
        f"`{n}`" for n in ServeSettings.model_fields
    ]
    port = next(r for r in table if r[0] == "`port`")
    assert port[1:6] == [
        "`int`",
        "`8000`",
        "≥ 0, ≤ 65535",
        "`--port`",
        "`EMBEDCACHE_PORT`",
    ]
    model = next(r for r in table if r[0].startswith("`model`"))
    assert model[0] == "`model` (`[[model]]` tables)"


def test_a_setting_added_to_the_model_gets_its_row():
    class Wider(ServeSettings):
        warmup_batches: int = Field(
            default=3, ge=0, le=64, description="batches run before /health/ready"
        )

    row = added_row(
        settings_table(ServeSettings, env_prefix=ENV_PREFIX),
        settings_table(Wider, env_prefix=ENV_PREFIX),
    )
    assert row == [
        "`warmup_batches`",
        "`int`",
        "`3`",
        "≥ 0, ≤ 64",
        "`--warmup-batches`",
        "`EMBEDCACHE_WARMUP_BATCHES`",
        "batches run before /health/ready",
    ]


def test_a_metric_added_to_the_registry_gets_its_row():
    metrics = Metrics()
    before = metrics_table(metrics)
    assert "`embedcache_requests_total`" in [r[0] for r in rows(before)]
    metrics.warm = Gauge(
        "embedcache_warm_models", "models loaded", ["model"], registry=metrics.registry
    )
    row = added_row(before, metrics_table(metrics))
    assert row == ["`embedcache_warm_models`", "gauge", "`model`", "models loaded"]


def real_families() -> list[types.ModuleType]:
    return [family_module(name) for name in FAMILY_MODULES]


def test_a_family_added_to_the_registry_gets_its_rows():
    new = types.ModuleType("embedcache.models.families.toy.adapter")
    new.__doc__ = "Toy-LM in plain PyTorch.\n\nMore words."
    new.FAMILY = "toy"
    new.FAMILY_OPTIONS = {"strand": ("both", "forward")}
    entry = dataclasses.replace(load_catalogue()[0], hub_id="lab/toy-1m", family="toy")
    records = {
        **load_family_records(),
        "toy": FamilyRecord(
            "toy", "embedcache's toy modules", "tests/models/test_toy.py"
        ),
    }
    modules = [*real_families(), new]

    row = added_row(
        families_table(real_families(), records), families_table(modules, records)
    )
    assert row == [
        "`toy`",
        "Toy-LM in plain PyTorch.",
        "embedcache's toy modules",
        "`--family-option strand=both|forward`",
        "tests/models/test_toy.py",
    ]

    row = added_row(
        checkpoints_table(real_families(), load_catalogue()),
        checkpoints_table(modules, [entry, *load_catalogue()]),
    )
    assert row[:2] == ["`lab/toy-1m`", "`toy`"]
    assert row[5] == entry.licence


def test_the_catalogue_has_every_registry_family_and_every_checkpoint():
    families = rows(families_table(real_families(), load_family_records()))
    assert [r[0] for r in families] == [f"`{m.FAMILY}`" for m in real_families()]
    assert all("not recorded" not in r for r in families)
    checkpoints = rows(checkpoints_table(real_families(), load_catalogue()))
    assert sorted(r[0] for r in checkpoints) == sorted(
        f"`{e.hub_id}`" for e in load_catalogue()
    )


def test_fill_replaces_each_marker_and_refuses_an_unknown_one():
    page = "# Page\n\n<!-- generated: one -->\n\ntext\n<!-- generated: two -->\n"
    tables = {"one": lambda: "| a |", "two": lambda: "| b |"}
    assert fill(page, tables) == "# Page\n\n| a |\n\ntext\n| b |\n"
    with pytest.raises(KeyError, match="no such table; known are"):
        fill("<!-- generated: three -->", tables)


def test_an_import_contract_added_to_pyproject_gets_its_row():
    import tomllib

    from scripts.docs_pages import ROOT_PYPROJECT, contracts_table

    declared = tomllib.loads(ROOT_PYPROJECT.read_text())["tool"]["importlinter"]
    before = contracts_table(declared)
    assert [r[0] for r in rows(before)] == [
        f"`{c['id']}`" for c in declared["contracts"]
    ]
    extra = {
        "id": "store-not-report",
        "name": "The store does not import the report",
        "type": "forbidden",
        "source_modules": ["embedcache.store"],
        "forbidden_modules": ["embedcache.report"],
    }
    row = added_row(
        before, contracts_table({"contracts": [*declared["contracts"], extra]})
    )
    assert row == [
        "`store-not-report`",
        "The store does not import the report",
        "forbidden",
        "`embedcache.store` never imports `embedcache.report`",
    ]
