"""Store keys are a contract: a refactor must not change any adapter's key digest.

The digests below were printed by the adapters before the package was laid out by
stage (issue 19); a stored vector is found again only if its key digest is the same.
Changing one means every existing store loses that model's vectors: do it only on
purpose, with a store migration.

Changed on purpose once: issue 43 pads each sequence to a bucket of its own length,
which moves the fp32 bits of every token-based family (dnabert2, ntv2, hyena,
generator, gena here; adapter version 1 -> 2). No migration: the old vectors depended
on their batch and cannot be made the new ones; they stay under the old keys.
And more in issue 43: Caduceus (1 -> 2: the fused scans' cheaper exp; 2 -> 3: the
fused scan's single gate, projections through the tuned linear; 3 -> 4 for bfloat16
keys only: the fused scan's degree-3 decay for a bfloat16 output) and HyenaDNA (2 -> 3:
vectorised kernels, one in-projection matmul a batch).
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
bb355e081410412e57bcdbfb01d1acde614548a41825da6c2d4e78a6e9cddf06 caduceus/ph -
ca5c09d9a88e3e95a37e603765bdbc7a7a547079cf6784fc1ce4819a15a18e5a caduceus/ph bf16,rc
5fb63413a1de9c79bf00421e5a3f21256c9b2436891d4fbc45a1cd33735bf483 dnabert2/dnabert2 -
97f3a6a63aeb7fafb80512ad3d199f0c0b037bcd8ae2aeeecce57c37bb9149cf ntv2/ntv2 bf16,rc
5188bfcd5566229ee7610e8f4052a93c9fe20f731833cbc869bb2fab93da17d8 hyena/tiny -
7a88a89fe789bd620d4c89f41a164561a2ed6afe79c112612b7e54afa9236681 generator/tiny bf16,rc
bc508dd2c79ebb6a6c9e4b0862afe056969798d5aea710591bac38361b1b0e26 gena/gena_base -
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
    assert digests == ["d669c521e04f", "1154dde71cff", "15985cc472bb", "8b9fa7a1102e"]
