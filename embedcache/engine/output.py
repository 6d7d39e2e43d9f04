"""The ``.npy`` file an embedding command writes, atomically (whole, or a block of rows
at a time).

Light on purpose (numpy only): the client writes its vectors through it too, without
the engine's model and cluster imports.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

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


class RowSink:
    """Where a streamed run's vectors go, a block of rows at a time, in input order:
    an array in memory, or (:class:`NpyRows`) a ``.npy`` file."""

    def __init__(self, shape: tuple[int, int]) -> None:
        self.shape = shape
        self.done = 0
        self._array: np.ndarray | None = None

    def write(self, rows: np.ndarray) -> None:
        """Append ``rows`` ((k, d) float32) after the rows written so far."""
        rows = np.ascontiguousarray(rows, dtype="<f4")
        if rows.shape[1:] != self.shape[1:] or self.done + len(rows) > self.shape[0]:
            msg = f"rows {rows.shape} after {self.done} do not fit {self.shape}"
            raise ValueError(msg)
        self._put(rows)
        self.done += len(rows)

    def _put(self, rows: np.ndarray) -> None:
        if self._array is None:
            self._array = np.empty(self.shape, np.float32)
        self._array[self.done : self.done + len(rows)] = rows

    def result(self) -> np.ndarray:
        """The rows written (all of them, once the run is done)."""
        if self._array is None:
            self._array = np.empty(self.shape, np.float32)
        return self._array


class NpyRows(RowSink):
    """A float32 ``.npy`` written front to back through a file: the rows pass through
    the page cache, not this process's memory (a mapped file's pages would count in
    its resident set); :meth:`result` maps the finished file read-only."""

    def __init__(self, fh: BinaryIO, path: Path, shape: tuple[int, int]) -> None:
        super().__init__(shape)
        self._fh, self._path = fh, path
        header = {"descr": "<f4", "fortran_order": False, "shape": shape}
        np.lib.format.write_array_header_1_0(fh, header)

    def _put(self, rows: np.ndarray) -> None:
        self._fh.write(memoryview(rows).cast("B"))

    def result(self) -> np.ndarray:
        return np.load(self._path, mmap_mode="r")


@contextlib.contextmanager
def npy_rows(path: Path | str | None, shape: tuple[int, int]) -> Iterator[RowSink]:
    """A sink for ``shape`` float32 rows: a ``.npy`` at ``path`` (in place atomically
    once every row is written and the block exits cleanly, never half-written), or
    an array in memory when ``path`` is None."""
    if path is None:
        yield RowSink(shape)
        return
    path = Path(path)
    with _replacing(path) as tmp, tmp.open("wb") as fh:
        rows = NpyRows(fh, path, shape)
        yield rows
        if rows.done != shape[0]:
            msg = f"{rows.done} of {shape[0]} rows written to {path}"
            raise ValueError(msg)
        fh.flush()
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
