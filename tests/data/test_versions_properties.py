"""Property tests of version TOML files: a valid file loads as written; one invalid
field anywhere is an error that names that field."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embedcache.data.datasets import dataset_specs
from embedcache.data.versions import load_version
from embedcache.errors import VersionSpecError

SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
DATASETS = sorted(dataset_specs())
text = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=30)


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a TOML basic string too
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(value)


def to_toml(version: dict) -> str:
    tables = version.get("datasets")
    if not isinstance(tables, list) or not all(isinstance(e, dict) for e in tables):
        tables = []  # an invalid datasets value: written as a plain key
    lines = [f"{k} = {toml_value(v)}" for k, v in version.items() if v is not tables]
    for entry in tables:
        lines.append("[[datasets]]")
        lines.extend(f"{k} = {toml_value(v)}" for k, v in entry.items())
    return "\n".join(lines) + "\n"


@st.composite
def versions(draw) -> dict:
    names = draw(st.lists(st.sampled_from(DATASETS), min_size=1, unique=True))
    datasets = []
    for name in names:
        self_split = draw(st.booleans())
        entry = {
            "name": name,
            "n_train": draw(st.integers(2, 10_000)),
            "n_test": draw(st.one_of(st.integers(1, 10_000), st.just("word"))),
            "source": draw(st.sampled_from(["hub", "mirror", "demo", "auto"])),
        }
        if self_split:
            entry["train_split"] = entry["test_split"] = "train"
        if entry["n_test"] == "word":
            entry["n_test"] = "rest" if self_split else "all"
        datasets.append(entry)
    return {
        "name": draw(text.filter(str.strip)),
        "description": draw(text),
        "seed": draw(st.integers(0, 2**31)),
        "comparable": draw(st.booleans()),
        "datasets": datasets,
    }


# per field, values that must be refused
BAD = {
    "name": [1, True, "", [1]],
    "seed": [True, 1.5, "7", [1]],
    "description": [1, False],
    "comparable": [1, "yes"],
    "datasets": [1, "x", [1, 2]],
    "n_train": [True, 1, -3, 2.5, "10"],
    "n_test": [True, 0, -1, 1.5, "everything"],
    "source": ["web", 1],
    "test_split": [1, ""],
    "train_split": [False, ""],
    "dataset name": [1, "no_such_dataset"],
    "unknown field": ["n_tset", "sed"],
}


def load(text: str):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "v.toml"
        path.write_text(text, encoding="utf-8")
        return load_version(path)


@SETTINGS
@given(version=versions())
def test_a_valid_version_loads_as_written(version):
    spec = load(to_toml(version))
    assert spec.name == version["name"]
    assert spec.seed == version["seed"]
    assert spec.comparable is version["comparable"]
    assert [d.name for d in spec.datasets] == [e["name"] for e in version["datasets"]]
    for draw, entry in zip(spec.datasets, version["datasets"], strict=True):
        assert draw.n_train == entry["n_train"]
        expected = entry["n_test"] if isinstance(entry["n_test"], int) else None
        assert draw.n_test == expected


@SETTINGS
@given(version=versions(), field=st.sampled_from(sorted(BAD)), data=st.data())
def test_one_invalid_field_is_an_error_naming_it(version, field, data):
    bad = data.draw(st.sampled_from(BAD[field]))
    entry = data.draw(st.sampled_from(version["datasets"]))
    if field in ("name", "seed", "description", "comparable", "datasets"):
        version[field] = bad
        named = field
    elif field == "dataset name":
        entry["name"] = bad
        named = "name" if not isinstance(bad, str) else repr(bad)
    elif field == "unknown field":
        entry[bad] = 1
        named = repr(bad)
    else:
        entry[field] = bad
        named = field
    with pytest.raises(VersionSpecError) as err:
        load(to_toml(version))
    assert named in str(err.value)
