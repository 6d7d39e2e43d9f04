"""Whether the store answers: a cheap read of its root, now and then, off the loop.

`/health/ready` reports the last answer, so a load balancer stops sending requests
to a server whose bucket is down and sends them again once it answers. The probe
opens its own object-store client with no retries and short timeouts: the store's
own client retries for a long while, which is right for a commit, wrong for a probe.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import anyio

from embedcache.service.workers import WorkerThreads

if TYPE_CHECKING:
    from collections.abc import Mapping

logger = logging.getLogger(__name__)

# the store root's Zarr group metadata: every store has it, and it is small
_ROOT_OBJECT = "zarr.json"


class StoreProbe:
    """Reads the store root's metadata every ``interval`` seconds; :attr:`ok` is
    whether the last read answered within ``timeout`` seconds."""

    def __init__(
        self,
        location: str,
        options: Mapping[str, str],
        *,
        interval: float,
        timeout: float,
    ) -> None:
        self.location = location
        self.options = dict(options)
        self.interval = interval
        self.timeout = timeout
        self.ok = True
        self.last = 0.0  # monotonic time of the last answer, good or bad
        self._client = None
        self._thread = WorkerThreads(1)  # a read that hangs blocks the next: 503

    def read(self) -> None:
        """One read of the root object (blocking).

        Raises
        ------
        Exception
            Whatever the backend raises: the store did not answer.
        """
        import obstore

        from embedcache.store.backend import is_url, open_object_store

        if self._client is None:
            options = self.options
            if is_url(self.location) and not self.location.startswith("file://"):
                seconds = f"{max(self.timeout, 0.1):g}s"
                options = {
                    **options,
                    "max_retries": "0",
                    "timeout": seconds,
                    "connect_timeout": seconds,
                }
            self._client = open_object_store(self.location, options)
        obstore.head(self._client, _ROOT_OBJECT)

    async def check(self) -> bool:
        """Read once, in a worker thread abandoned past the timeout; record it. While
        an abandoned read still hangs, no new one starts (one thread at most)."""
        try:
            with anyio.fail_after(self.timeout):
                await self._thread.run(self.read)
            ok, why = True, ""
        except Exception as err:  # noqa: BLE001 (any failure means not answering)
            ok, why = False, f"{type(err).__name__}: {err}"
        if ok != self.ok:
            if ok:
                logger.info("the store answers again")
            else:
                logger.warning("the store did not answer its probe (%s)", why)
        self.ok, self.last = ok, time.monotonic()
        return ok

    async def run(self) -> None:
        """Probe until cancelled."""
        while True:
            await self.check()
            await asyncio.sleep(self.interval)


__all__ = ["StoreProbe"]
