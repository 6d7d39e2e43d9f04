"""The request path's worker threads are bounded, abandoned ones counted: a call
whose caller's deadline passed keeps its slot until it really returns."""

from __future__ import annotations

import asyncio
import threading

import pytest

from embedcache.service.errors import ServiceUnavailableError
from embedcache.service.workers import WorkerThreads


def test_abandoned_calls_keep_their_slot_until_they_return():
    release = threading.Event()
    workers = WorkerThreads(2)

    def look_up(started):
        started.set()
        release.wait(30)

    async def scenario():
        for _ in range(2):  # two look-ups past their deadline, still running
            started = threading.Event()
            call = asyncio.ensure_future(workers.run(look_up, started))
            while not started.is_set():
                await asyncio.sleep(0.01)
            call.cancel()  # the deadline: the caller stops waiting at once
            with pytest.raises(asyncio.CancelledError):
                await call
        assert workers.busy == 2
        with pytest.raises(ServiceUnavailableError):  # 503, not a third thread
            await workers.run(lambda: 1)
        release.set()
        for _ in range(200):
            if workers.busy == 0:
                break
            await asyncio.sleep(0.01)
        assert workers.busy == 0
        assert await workers.run(lambda: 7) == 7

    before = threading.active_count()
    asyncio.run(scenario())
    assert threading.active_count() <= before + 2


def test_an_error_in_the_call_frees_its_slot():
    workers = WorkerThreads(1)

    def broken():
        msg = "the store failed"
        raise OSError(msg)

    async def scenario():
        with pytest.raises(OSError, match="the store failed"):
            await workers.run(broken)
        assert workers.busy == 0
        assert await workers.run(lambda: 3) == 3

    asyncio.run(scenario())
