"""The ``.npy`` file an embedding command writes, atomically (whole, or a block of rows
at a time).

Light on purpose (numpy only): the client writes its vectors through it too, without
the engine's model and cluster imports.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Iterator


def write_npy(path: Path | str, array: np.ndarray) -> Path:
    """Write ``array`` as ``.npy`` atomically: a reader sees the old file or the new."""
    path = Path(path)
    with _replacing(path) as tmp, tmp.open("wb") as fh:
        np.save(fh, array)
        fh.flush()
        os.fsync(fh.fileno())
    return path


@contextlib.contextmanager
def npy_rows(path: Path | str | None, shape: tuple[int, int]) -> Iterator[np.ndarray]:
    """A float32 array of ``shape`` for the caller to fill a block of rows at a time:
    a ``.npy`` at ``path`` on disk (mapped; in place atomically once the block exits
    cleanly, never half-written), or an array in memory when ``path`` is None."""
    if path is None:
        yield np.empty(shape, np.float32)
        return
    with _replacing(Path(path)) as tmp:
        rows = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=shape)
        yield rows
        rows.flush()
        del rows
        with tmp.open("rb+") as fh:
            os.fsync(fh.fileno())


@contextlib.contextmanager
def _replacing(path: Path) -> Iterator[Path]:
    """A temporary name beside ``path`` that replaces it once the block exits cleanly."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
