from __future__ import annotations

import subprocess
import sys

from embedcache.models import FAMILY_MODULES, family_module
from embedcache.models.catalogue import load_catalogue


def test_every_entry_names_a_family_embedcache_has():
    families = {family_module(name).FAMILY for name in FAMILY_MODULES}
    entries = load_catalogue()
    assert entries
    for entry in entries:
        assert entry.family in families, entry.hub_id
        assert entry.rc_default in {"none", "average"}
        assert "/" in entry.hub_id


def test_models_command_lists_families_and_checkpoints():
    out = subprocess.run(
        [sys.executable, "-m", "embedcache.cli", "models"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for entry in load_catalogue():
        assert entry.hub_id in out
    for name in FAMILY_MODULES:
        assert family_module(name).FAMILY in out


def test_every_family_has_one_record_of_what_it_loads_into_and_its_evidence():
    from embedcache.models.catalogue import load_family_records

    families = {family_module(name).FAMILY for name in FAMILY_MODULES}
    records = load_family_records()
    assert set(records) == families
    for record in records.values():
        assert record.loaded_into
        assert "tests/models/test_" in record.equality, record.family
