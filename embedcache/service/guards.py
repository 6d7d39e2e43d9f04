"""ASGI middleware in front of every route: request ids, API keys, the body-size
limits (per request, and server-wide on the bodies held at once), and the request
metrics (so refused requests are counted too)."""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import time
from typing import TYPE_CHECKING, Any

from embedcache.service.wire import (
    HEADER_REQUEST_ID,
    ROUTE_LIVE,
    ROUTE_READY,
    error_body,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, MutableMapping

    from embedcache.service.metrics import Metrics

    Scope = MutableMapping[str, Any]
    Message = MutableMapping[str, Any]
    Receive = Callable[[], Awaitable[Message]]
    Send = Callable[[Message], Awaitable[None]]
    ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

logger = logging.getLogger(__name__)

OPEN_ROUTES = frozenset({ROUTE_LIVE, ROUTE_READY})
_REQUEST_ID = "embedcache.request_id"  # the scope entry holding it


def request_id(scope: Scope) -> str:
    """The id the :class:`Guard` gave this request ("-" outside one)."""
    return scope.get(_REQUEST_ID, "-")


def key_matches(given: bytes, keys: Iterable[bytes]) -> bool:
    """Whether ``given`` is one of ``keys``, comparing against every key in constant
    time (no early exit that would tell how many keys there are or which matched)."""
    found = False
    for key in keys:
        found |= hmac.compare_digest(given, key)
    return found


class Guard:
    """Give every request an id (the ``X-Request-Id`` reply header); count every reply
    by route and status; refuse unauthenticated requests (401), bodies over
    ``max_body_bytes`` (413), and bodies beyond ``max_buffered_bytes`` held by all
    requests at once (503), before the app reads them."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: Metrics,
        routes: Iterable[str],
        api_keys: Iterable[str] = (),
        max_body_bytes: int,
        max_buffered_bytes: int,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = frozenset(routes)
        self.keys = tuple(key.encode() for key in api_keys)
        self.max_body_bytes = max_body_bytes
        self.max_buffered_bytes = max_buffered_bytes
        self.buffered = 0  # bytes of request bodies held now (one event loop: no lock)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        route = path if path in self.routes else "other"
        status = {"code": 500}
        start = time.perf_counter()
        rid = scope[_REQUEST_ID] = secrets.token_hex(8)

        async def counted_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                message["headers"] = [
                    *message.get("headers", ()),
                    (HEADER_REQUEST_ID.lower().encode(), rid.encode()),
                ]
                status["sent"] = True
            await send(message)

        try:
            await self._guarded(scope, receive, counted_send)
        except Exception as err:
            # the app's handler answered (and logged) it and re-raised; uvicorn would
            # log it again as a traceback
            if not status.get("sent"):
                logger.error("request %s: unexpected error", rid, exc_info=err)
                await _reply(counted_send, 500, "internal error", request_id=rid)
        finally:
            self.metrics.requests.labels(route, str(status["code"])).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - start)

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self.keys
            and scope["path"] not in OPEN_ROUTES
            and not self._authorised(scope)
        ):
            await _reply(
                send,
                401,
                "missing or wrong API key: send `Authorization: Bearer KEY`",
                headers=[(b"www-authenticate", b"Bearer")],
            )
            return
        limit = self.max_body_bytes
        headers = dict(scope.get("headers") or ())
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _reply(send, 413, _too_large(limit))
            return
        # read the body here, counting, so a chunked body cannot pass the limit
        chunks, size = [], 0
        try:
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    await self.app(scope, _replay([message], receive), send)
                    return
                chunk = message.get("body", b"")
                size += len(chunk)
                self.buffered += len(chunk)
                if size > limit:
                    await _reply(send, 413, _too_large(limit))
                    return
                if self.buffered > self.max_buffered_bytes:
                    msg = "the server holds too many request bodies now; retry later"
                    await _reply(send, 503, msg, headers=[(b"retry-after", b"1")])
                    return
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
            body = {
                "type": "http.request",
                "body": b"".join(chunks),
                "more_body": False,
            }
            del chunks
            await self.app(scope, _replay([body], receive), send)
        finally:
            self.buffered -= size

    def _authorised(self, scope: Scope) -> bool:
        for name, value in scope.get("headers") or ():
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                return scheme.lower() == b"bearer" and key_matches(
                    token.strip(), self.keys
                )
        return False


def _too_large(limit: int) -> str:
    return f"the request body is over the limit of {limit} bytes ({limit / 2**20:g} MiB); split it"


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A receive that gives ``messages`` first, then the connection's own (which
    reports the client's disconnect)."""
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay


async def _reply(
    send: Send,
    status: int,
    message: str,
    *,
    headers: list[tuple[bytes, bytes]] | None = None,
    request_id: str | None = None,
) -> None:
    body = json.dumps(
        error_body(message, status=status, request_id=request_id)
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


__all__ = ["Guard", "key_matches", "request_id"]
