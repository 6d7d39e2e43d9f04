"""zarr's view of the backend's obstore store, with no Python callback from Rust threads.

zarr's own ``ObjectStore`` awaits obstore's ``*_async`` calls: obstore's tokio threads
then hand each result to the asyncio loop themselves, taking the GIL. When one of
them is still between handing over a result and taking the GIL back while the
interpreter exits, CPython ends that thread with ``pthread_exit``, which Rust cannot
unwind: the process aborts (SIGABRT, exit 134) after its work is done and printed
(seen as a rare abort of `embedcache store ls` on a loaded machine; the gdb backtrace
shows ``tokio-rt-worker`` in ``take_gil`` -> ``PyThread_exit_thread`` -> ``abort``).

:class:`ThreadedObjectStore` makes the same requests through obstore's blocking calls
on Python worker threads (``asyncio.to_thread``): obstore waits inside the calling
thread with the GIL released, and its tokio threads never touch Python. zarr still
runs chunk requests concurrently, one worker thread each.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import obstore
from obstore.exceptions import AlreadyExistsError
from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.storage import ObjectStore

if TYPE_CHECKING:
    from collections.abc import Iterable

    from zarr.abc.store import ByteRequest
    from zarr.core.buffer import Buffer, BufferPrototype

# what zarr's ObjectStore reads as "no such object" (it answers None)
_ABSENT = (FileNotFoundError, IsADirectoryError, NotADirectoryError)


def _range_option(byte_range: ByteRequest) -> dict[str, Any]:
    if isinstance(byte_range, RangeByteRequest):
        return {"range": (byte_range.start, byte_range.end)}
    if isinstance(byte_range, OffsetByteRequest):
        return {"range": {"offset": byte_range.offset}}
    if isinstance(byte_range, SuffixByteRequest):
        return {"range": {"suffix": byte_range.suffix}}
    msg = f"unexpected byte range {byte_range!r}"
    raise ValueError(msg)


class ThreadedObjectStore(ObjectStore):
    """zarr's ObjectStore whose reads, writes and deletes use obstore's blocking API
    on worker threads (listing, which our arrays never do, stays zarr's)."""

    def _get_bytes(self, key: str, byte_range: ByteRequest | None) -> Any:  # noqa: ANN401
        """obstore's Bytes (a buffer, not copied), or None when absent."""
        options = {} if byte_range is None else _range_option(byte_range)
        try:
            return obstore.get(self.store, key, options=options).bytes()
        except _ABSENT:
            return None

    async def get(
        self,
        key: str,
        prototype: BufferPrototype,
        byte_range: ByteRequest | None = None,
    ) -> Buffer | None:
        data = await asyncio.to_thread(self._get_bytes, key, byte_range)
        return None if data is None else prototype.buffer.from_bytes(data)

    async def get_partial_values(
        self,
        prototype: BufferPrototype,
        key_ranges: Iterable[tuple[str, ByteRequest | None]],
    ) -> list[Buffer | None]:
        return list(
            await asyncio.gather(
                *(
                    self.get(key, prototype, byte_range)
                    for key, byte_range in key_ranges
                )
            )
        )

    async def exists(self, key: str) -> bool:
        try:
            await asyncio.to_thread(obstore.head, self.store, key)
        except FileNotFoundError:
            return False
        return True

    async def set(self, key: str, value: Buffer) -> None:
        self._check_writable()
        await asyncio.to_thread(obstore.put, self.store, key, value.as_buffer_like())

    async def set_if_not_exists(self, key: str, value: Buffer) -> None:
        self._check_writable()
        with contextlib.suppress(AlreadyExistsError):
            await asyncio.to_thread(
                obstore.put, self.store, key, value.as_buffer_like(), mode="create"
            )

    async def delete(self, key: str) -> None:
        self._check_writable()
        # local stores raise for a missing object, S3 does not: both mean "gone"
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(obstore.delete, self.store, key)

    async def getsize(self, key: str) -> int:
        head = await asyncio.to_thread(obstore.head, self.store, key)
        return int(head["size"])


__all__ = ["ThreadedObjectStore"]
