"""Raw chunk reads of a run's vectors, beside zarr: the same crc32c check, one copy.

zarr reads a chunk through its codec pipeline; for the layout this schema writes
(bytes + crc32c, little-endian, one chunk across the columns) a chunk is its rows'
bytes followed by their crc32c, which these functions read and check themselves.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import google_crc32c
import numpy as np

if TYPE_CHECKING:
    from embedcache.store.backend import Backend


class MissingObjectError(Exception):
    """An object of a committed run is absent: retired meanwhile, or lost."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


def read_span(
    backend: Backend,
    prefix: str,
    arr: Any,  # noqa: ANN401
    r0: int,
    target: np.ndarray,
) -> bool:
    """target[:] = rows r0.. of the vectors, chunk by chunk, bypassing zarr.

    The same check zarr makes (each chunk's crc32c, stored after its bytes) at
    the speed of a plain read: a local chunk is read straight into ``target``
    (one copy, as ``np.load``), a remote one copied once from its buffer. Only for
    the layout this schema writes (checked: bytes + crc32c, little-endian, one
    chunk across the columns); returns False to leave any other to zarr.

    Raises
    ------
    ValueError
        A chunk fails its crc32c or has the wrong size (as zarr would).
    MissingObjectError
        A chunk is absent.
    """
    if sys.byteorder != "little" or not target.flags.c_contiguous:
        return False
    per = int(arr.chunks[0])
    row_bytes = 4 * target.shape[1]
    first, last = r0 // per, (r0 + len(target) - 1) // per

    def fill(c: int) -> None:
        path = f"{prefix}/vectors/{arr.metadata.encode_chunk_key((c, 0))}"
        lo, hi = max(r0, c * per), min(r0 + len(target), (c + 1) * per)
        rows = target[lo - r0 : hi - r0]
        dest = memoryview(rows).cast("B")
        skip, want = (lo - c * per) * row_bytes, (hi - lo) * row_bytes
        whole = skip == 0 and want == per * row_bytes
        if whole and backend.local is not None:  # the file straight into target
            try:
                with (backend.local / path).open("rb") as f:
                    got = f.readinto(dest)
                    tail = f.read()
            except FileNotFoundError as err:
                raise MissingObjectError(path) from err
            body, crc = rows, tail
            if got != want or len(tail) != 4:
                msg = f"chunk {path} has {got + len(tail)} bytes, not {want + 4}"
                raise ValueError(msg)
        else:
            data = backend.read_or_none(path)
            if data is None:
                raise MissingObjectError(path)
            if len(data) != per * row_bytes + 4:
                msg = f"chunk {path} has {len(data)} bytes, not {per * row_bytes + 4}"
                raise ValueError(msg)
            body, crc = np.frombuffer(data, np.uint8)[:-4], data[-4:]
        # numpy arrays, not memoryviews: google_crc32c takes only plain buffers
        if google_crc32c.value(body).to_bytes(4, "little") != bytes(crc):
            msg = f"chunk {path}: stored and computed crc32c differ"
            raise ValueError(msg)
        if not whole or backend.local is None:
            dest[:] = memoryview(body)[skip : skip + want]

    backend.map(fill, range(first, last + 1))
    return True


def is_run(idx: np.ndarray) -> bool:
    return bool(idx[-1] - idx[0] == len(idx) - 1 and np.all(np.diff(idx) == 1))


def find_bad_chunk(
    arr: Any,  # noqa: ANN401
    prefix: str,
    rows: np.ndarray,
    err: Exception,
) -> tuple[str, str]:
    """Name the first chunk among ``rows``' that fails to read, and why."""
    per_chunk = arr.chunks[0]
    for c in np.unique(rows // per_chunk):
        try:
            arr.get_block_selection((int(c), 0))
        except ValueError as bad:
            return f"{prefix}/vectors/c/{c}/0", f"chunk failed its check ({bad})"
    return f"{prefix}/vectors", f"could not be read ({err})"
