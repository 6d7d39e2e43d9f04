"""The worker threads of the request path, bounded: parsing, look-ups, read-backs
and replies run there, never on the event loop.

A request past its deadline stops waiting for its thread at once (the loop answers
504), but the thread runs on until its call returns: a store that takes 15 s a
look-up would leave one such thread per request behind, and a wave of requests a
wave of threads (issue 42: 9 to 209). So a call holds its slot until it really
returns, abandoned or not, and past ``limit`` calls in flight a request gets 503
with ``Retry-After`` instead of a new thread.
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, TypeVar

import anyio
import anyio.to_thread

from embedcache.service.errors import ServiceUnavailableError

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")


class WorkerThreads:
    """At most ``limit`` calls in worker threads at once, abandoned ones counted."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._busy = 0
        self._lock = threading.Lock()
        self._limiter: anyio.CapacityLimiter | None = None  # made on the loop

    @property
    def busy(self) -> int:
        """Calls in flight (waited for or abandoned)."""
        return self._busy

    async def run(self, func: Callable[..., T], *args: object, **kwargs: object) -> T:
        """``func(*args, **kwargs)`` in a worker thread; a cancelled wait (a
        deadline) returns at once, the call keeps its slot until it returns.

        Raises
        ------
        ServiceUnavailableError
            Every slot is taken (503, retry shortly).
        """
        with self._lock:
            if self._busy >= self.limit:
                msg = (
                    f"the server's {self.limit} worker threads are all busy (the store "
                    "may be slow); retry shortly"
                )
                raise ServiceUnavailableError(msg)
            self._busy += 1
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.limit)
        slot = _Slot(self._release)
        call = functools.partial(slot.call, func, *args, **kwargs)
        try:
            return await anyio.to_thread.run_sync(
                call, abandon_on_cancel=True, limiter=self._limiter
            )
        except BaseException:
            slot.give_up()  # never started: it never will, and its slot is free
            raise

    def _release(self) -> None:
        with self._lock:
            self._busy -= 1


class _Slot:
    """One call's hold on a slot: released once, when the call returns or, if it
    never started, when its caller gives up."""

    def __init__(self, release: Callable[[], None]) -> None:
        self._release = release
        self._lock = threading.Lock()
        self._started = False
        self._done = False

    def call(self, func: Callable[..., T], *args: object, **kwargs: object) -> T | None:
        with self._lock:
            if self._done:  # its caller gave up before it started
                return None
            self._started = True
        try:
            return func(*args, **kwargs)
        finally:
            self._done = True
            self._release()

    def give_up(self) -> None:
        with self._lock:
            if self._started or self._done:
                return
            self._done = True
        self._release()


__all__ = ["WorkerThreads"]
