"""Checks of what a caller hands ``EmbeddingStore.put``: the vectors and an alias."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from embedcache.errors import (
    DimensionMismatchError,
    InvalidAliasError,
    InvalidVectorError,
)

if TYPE_CHECKING:
    from embedcache.specs import ModelKey


def check_vectors(key: ModelKey, n: int, vectors: object) -> np.ndarray:
    arr = np.asarray(vectors)
    if arr.ndim != 2 or arr.shape[0] != n or arr.shape[1] == 0:
        msg = (
            f"vectors for {key.short()} (key {key.digest[:12]}) have shape {arr.shape}; "
            f"expected ({n}, dim) with dim >= 1: one row per hash"
        )
        raise DimensionMismatchError(msg)
    if arr.dtype.kind != "f":
        msg = (
            f"vectors for {key.short()} (key {key.digest[:12]}) have dtype {arr.dtype}; "
            "the store keeps float32: pass floating-point vectors"
        )
        raise DimensionMismatchError(msg)
    out = arr.astype(np.float32, copy=False)
    finite = np.isfinite(out).all(axis=1)
    if not finite.all():
        row = int(np.flatnonzero(~finite)[0])
        msg = (
            f"vector row {row} for {key.short()} is not finite in float32 "
            "(NaN, inf, or beyond float32 range); nothing was written"
        )
        raise InvalidVectorError(msg)
    return np.ascontiguousarray(out)


def check_alias(alias: object) -> str:
    if (
        not isinstance(alias, str)
        or not 0 < len(alias) <= 200
        or not alias.isprintable()
    ):
        msg = (
            f"alias {alias!r} is not a display name: give 1-200 printable characters "
            "(e.g. the model's folder name)"
        )
        raise InvalidAliasError(msg)
    return alias
