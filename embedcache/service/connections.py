"""HTTP/1.1 connections with read deadlines: a socket that sends nothing holds nothing.

uvicorn's h11 protocol closes a keep-alive connection that stays idle after a reply,
but waits forever for the first request's headers and for a request's body: a
client that connects and says nothing, or sends half a body, holds its socket (and
with uvicorn's ``limit_concurrency``, which counts connections, a place every other
request needed). :class:`TimedH11Protocol` adds the two missing deadlines:

- headers: from the connection's start, or from the first byte after an idle
  keep-alive, until the request's headers are in;
- body: from the headers until the body's last byte.

Past either the connection is closed (a request whose body was cut short sees a
disconnect). The keep-alive idle deadline stays uvicorn's ``timeout_keep_alive``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from uvicorn.protocols.http.h11_impl import H11Protocol

if TYPE_CHECKING:
    import asyncio

logger = logging.getLogger(__name__)


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with header and body read deadlines (seconds); make a
    configured one with :func:`timed_protocol`."""

    header_timeout: float = 10.0
    body_timeout: float = 60.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # noqa: ANN401
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_for: str | None = None  # "headers" or "body" while armed

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._arm(None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def _watch(self) -> None:
        """Arm the deadline of what the connection waits for from the client."""
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            # between requests: idle is uvicorn's keep-alive timer's; once a byte
            # came (or on a new connection) the headers must follow
            idle = self.timeout_keep_alive_task is not None
            self._arm(None if idle else "headers")
        elif cycle.more_body and not cycle.disconnected:
            self._arm("body")
        else:
            self._arm(None)  # the app has the whole request: its deadline applies

    def _arm(self, waiting_for: str | None) -> None:
        if waiting_for == self._waiting_for:
            return  # keep the running deadline: it counts from its start
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._waiting_for = waiting_for
        if waiting_for is not None and not self.transport.is_closing():
            seconds = (
                self.header_timeout if waiting_for == "headers" else self.body_timeout
            )
            self._deadline = self.loop.call_later(seconds, self._expire)

    def _expire(self) -> None:
        waited, seconds = (
            ("headers", self.header_timeout)
            if self._waiting_for == "headers"
            else ("body", self.body_timeout)
        )
        self._deadline = None
        self._waiting_for = None
        if self.transport.is_closing():
            return
        client = "%s:%d" % self.client if self.client else "a client"  # noqa: UP031
        logger.info(
            "closed the connection of %s: no complete request %s within %g s",
            client,
            waited,
            seconds,
        )
        self.transport.close()


def timed_protocol(*, header_timeout: float, body_timeout: float) -> type[H11Protocol]:
    """A :class:`TimedH11Protocol` with these deadlines, for ``uvicorn.Config(http=)``."""
    return type(
        "TimedH11Protocol",
        (TimedH11Protocol,),
        {"header_timeout": header_timeout, "body_timeout": body_timeout},
    )


__all__ = ["TimedH11Protocol", "timed_protocol"]
