"""Sequence hashes as raw sha256 keys: checked at the boundary, printed as hex.

A key's hashes are found through each run's sorted index (``runs``).
"""

from __future__ import annotations

import binascii
import re
from typing import TYPE_CHECKING

import numpy as np

from embedcache.errors import InvalidHashError
from embedcache.store.layout import HASH_WIDTH

if TYPE_CHECKING:
    from collections.abc import Sequence

_HASH_RE = re.compile(r"[0-9a-f]{64}")


def check_hashes(hashes: Sequence[str]) -> np.ndarray:
    """Validate sequence hashes at the boundary; return them as raw (n,) S32 keys."""
    hs = hashes if isinstance(hashes, list) else list(hashes)
    if not hs:
        return np.empty(0, "S32")
    try:
        raw = "".join(hs).encode("ascii")
    except (TypeError, UnicodeEncodeError):
        raw = b""
    # vectorised check (41k hashes in a few ms): only [0-9a-f], 64 per hash
    if (
        len(raw) == 64 * len(hs)
        and not raw.translate(None, b"0123456789abcdef")
        and set(map(len, hs)) == {64}
    ):
        return np.frombuffer(binascii.unhexlify(raw), "S32")
    for i, h in enumerate(hs):
        if not isinstance(h, str) or not _HASH_RE.fullmatch(h):
            msg = (
                f"hash #{i} {h!r} is not a sequence key (64 lowercase hex characters); "
                "compute it with embedcache.hashing.sequence_key(seq)"
            )
            raise InvalidHashError(msg)
    raise AssertionError  # unreachable: the fast check failed, so one item is bad


def to_hex(keys: np.ndarray) -> list[str]:
    text = keys.tobytes().hex()
    return [text[i : i + 64] for i in range(0, len(text), 64)]


def key_bytes(keys: np.ndarray) -> np.ndarray:
    """S32 ``keys`` as an (n, 32) uint8 view (a copy only if not contiguous)."""
    return np.ascontiguousarray(keys, "S32").view(np.uint8).reshape(-1, HASH_WIDTH)


def argsort_keys(keys: np.ndarray) -> np.ndarray:
    """A stable argsort of S32 keys, by their first 8 bytes as integers (several
    times faster than comparing bytes); the full keys decide only where two share
    those 8 bytes."""
    if len(keys) < 2:
        return np.arange(len(keys))
    head = key_bytes(keys)[:, :8].copy().view(">u8")[:, 0]  # 8 bytes a key copied
    order = np.argsort(head, kind="stable")
    ranked = head[order]
    if np.any(ranked[1:] == ranked[:-1]):  # sha256 prefixes collide: rare
        return np.argsort(keys, kind="stable")
    return order


def first_rows(keys: np.ndarray) -> np.ndarray:
    """Rows holding the first occurrence of each distinct S32 key, in key order
    (int64)."""
    if not len(keys):
        return np.empty(0, np.int64)
    order = argsort_keys(keys)  # stable: the first row leads each run
    ranked = keys[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = ranked[1:] != ranked[:-1]
    del ranked
    return order[first].astype(np.int64, copy=False)
