"""Sequence normalisation, reverse complement and the content hash that identifies a sequence."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

_COMPLEMENT = str.maketrans("ACGTNacgtn", "TGCANtgcan")


def normalise_sequence(seq: str) -> str:
    """Upper-case a sequence: case carries no meaning for the benchmarks (soft-masking)."""
    return seq.upper()


def reverse_complement(seq: str) -> str:
    """Reverse complement over A/C/G/T/N, keeping case."""
    return seq.translate(_COMPLEMENT)[::-1]


def sequence_key(seq: str) -> str:
    """The sha256 hex digest of the normalised sequence: its identity in data and store."""
    return sequence_digest(seq).hex()


def sequence_digest(seq: str) -> bytes:
    """The raw 32-byte sha256 of the normalised sequence (``sequence_key`` in hex).

    A million of these fit in a 32 MB ``S32`` array, where their hex strings as
    Python objects take ~120 MB.
    """
    return hashlib.sha256(normalise_sequence(seq).encode("ascii")).digest()


def files_digest(root: Path, files: Iterable[Path]) -> str:
    """``"sha256:<hex>"`` over the sorted relative names and bytes of ``files`` under ``root``.

    A local model's revision: it changes whenever a file that decides its vectors does,
    and survives moving the folder.
    """
    digest = hashlib.sha256()
    for file in sorted(files, key=lambda p: p.relative_to(root).as_posix()):
        digest.update(file.relative_to(root).as_posix().encode("utf-8") + b"\0")
        file_digest = hashlib.sha256()
        with file.open("rb") as fh:
            for block in iter(lambda fh=fh: fh.read(1 << 20), b""):
                file_digest.update(block)
        digest.update(file_digest.digest())
    return f"sha256:{digest.hexdigest()}"
