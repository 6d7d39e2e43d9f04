"""Store keys are a contract: a refactor must not change any adapter's key digest.

The digests below were printed by the adapters before the package was laid out by
stage (issue 19); a stored vector is found again only if its key digest is the same.
Changing one means every existing store loses that model's vectors: do it only on
purpose, with a store migration.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from embedcache.models import load_adapter

FIXTURES = Path(__file__).parents[1] / "fixtures"

# key digest, model (a fixture folder if it has a "/"), flags ("-" for none)
PINNED_ROWS = """
2fce9d0360494c8e68dfd6d5459a90fc9c74c30865e8becc2dce2f20a604b79c kmer-4 -
9f484b8e252accc7780f8295adf5aea1beb8e87566c560d56e53253b10c00437 gc -
c3c8dfba24ef598732bc42cbaa10e8fef21b76f72649f191e87152a88cea4b47 caduceus/ph -
20f5b69d5a4c56d2f4fd22297447a6f88897fc26aec29f59ee022f976d6bc281 caduceus/ph bf16,rc
e6bede14834d8f9692e81d9c5390090ac3d71bfd6be6cc2a298cb4c35d254d30 dnabert2/dnabert2 -
b1484ad7964ba21add3ff80fe7476d5485f7ef4a02664dd65da4e5bd803c4f21 ntv2/ntv2 bf16,rc
6ea2b30dec5dc090d3374764d537ffb40742ac875695b01ce5b7416026bbfe0e hyena/tiny -
df935763d6121e4c9bf0580f541a0c33a9bc6da39ca1388c749a8cf6a4776cc6 generator/tiny bf16,rc
2583599c47bd9af86e2eab53cb222f4e1a4da40e315de3a160744bf350b77c7a gena/gena_base -
"""
PINNED = {
    (model, tuple(flags.split(",")) if flags != "-" else ()): digest
    for digest, model, flags in (
        row.split() for row in PINNED_ROWS.strip().splitlines()
    )
}


@pytest.mark.parametrize(("model", "flags"), list(PINNED), ids=str)
def test_key_digest_is_unchanged(model, flags):
    source = str(FIXTURES / model) if "/" in model else model
    options = {}
    if "bf16" in flags:
        options["dtype"] = "bfloat16"
    if "rc" in flags:
        options["rc_mode"] = "average"
    adapter = load_adapter(source, **options)
    assert adapter.key.digest == PINNED[model, flags]


def test_demo_control_digests_are_unchanged():
    # the demo's random-init Caduceus control with --layers all: its keys in every
    # demo store (layer -1 first, then blocks 0..2)
    adapter = load_adapter("caduceus-tiny", random_init=0, layers=(-1, 0, 1, 2))
    digests = [key.digest[:12] for key in adapter.keys]
    assert digests == ["ae12fcedb3e4", "99867b3265c2", "73c4df2b76a7", "3c90bcd90be6"]
