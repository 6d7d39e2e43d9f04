"""Sequence normalisation, reverse complement and the content hash that identifies a sequence."""

from __future__ import annotations

import hashlib

_COMPLEMENT = str.maketrans("ACGTNacgtn", "TGCANtgcan")


def normalise_sequence(seq: str) -> str:
    """Upper-case a sequence: case carries no meaning for the benchmarks (soft-masking)."""
    return seq.upper()


def reverse_complement(seq: str) -> str:
    """Reverse complement over A/C/G/T/N, keeping case."""
    return seq.translate(_COMPLEMENT)[::-1]


def sequence_key(seq: str) -> str:
    """The sha256 hex digest of the normalised sequence: its identity in data and store."""
    return hashlib.sha256(normalise_sequence(seq).encode("ascii")).hexdigest()
