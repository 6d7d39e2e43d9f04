"""ASGI middleware in front of every route: request ids, API keys, the request
limit, the body-size limits (per request, and server-wide on the bodies held at
once), the request metrics (so refused requests are counted too) and the access log.

Admission counts requests, never connections: an idle keep-alive or a socket that
never finished its request holds no place (the protocol's read deadlines close it,
:mod:`embedcache.service.connections`), and the health and metrics routes are never
refused by the limit, so a busy replica still answers its probes."""

from __future__ import annotations

import hmac
import json
import logging
import re
import secrets
import time
from typing import TYPE_CHECKING, Any

from embedcache.service.wire import (
    HEADER_REQUEST_ID,
    ROUTE_LIVE,
    ROUTE_METRICS,
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
# one line a request: method, route, status, milliseconds, request id
access_logger = logging.getLogger("embedcache.service.access")

OPEN_ROUTES = frozenset({ROUTE_LIVE, ROUTE_READY})
# never refused by the request limit: a probe must see a busy replica as alive
UNLIMITED_ROUTES = frozenset({ROUTE_LIVE, ROUTE_READY, ROUTE_METRICS})
_REQUEST_ID = "embedcache.request_id"  # the scope entry holding it
_HEADER_REQUEST_ID = HEADER_REQUEST_ID.lower().encode()
# an incoming id is kept when it is a plain token (it goes into log lines as is)
_GOOD_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:/+=-]{1,128}")


def request_id(scope: Scope) -> str:
    """The id the :class:`Guard` gave this request ("-" outside one)."""
    return scope.get(_REQUEST_ID, "-")


def incoming_request_id(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The client's ``X-Request-Id`` when it is a plain token of at most 128
    characters (a balancer's or a caller's, so one id follows the request through
    every log), else a new random one."""
    for name, value in headers:
        if name.lower() == _HEADER_REQUEST_ID and _GOOD_REQUEST_ID.fullmatch(value):
            return value.decode()
    return secrets.token_hex(8)


def key_matches(given: bytes, keys: Iterable[bytes]) -> bool:
    """Whether ``given`` is one of ``keys``, comparing against every key in constant
    time (no early exit that would tell how many keys there are or which matched)."""
    found = False
    for key in keys:
        found |= hmac.compare_digest(given, key)
    return found


class Guard:
    """Give every request an id (the client's ``X-Request-Id``, else a new one; in the
    reply header and every log line of the request); count every reply by route and
    status; refuse unauthenticated requests (401), requests beyond
    ``limit_requests`` at once (429, health and metrics excepted), bodies over
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
        limit_requests: int | None = None,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = frozenset(routes)
        self.keys = tuple(key.encode() for key in api_keys)
        self.max_body_bytes = max_body_bytes
        self.max_buffered_bytes = max_buffered_bytes
        self.limit_requests = limit_requests
        # one event loop: no lock for these
        self.buffered = 0  # bytes of request bodies held now
        self.in_flight = 0  # requests counted by the limit, now

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        route = path if path in self.routes else "other"
        status = {"code": 500}
        start = time.perf_counter()
        rid = scope[_REQUEST_ID] = incoming_request_id(scope.get("headers") or ())

        async def counted_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                message["headers"] = [
                    *message.get("headers", ()),
                    (HEADER_REQUEST_ID.lower().encode(), rid.encode()),
                ]
                status["sent"] = True
            await send(message)

        limited = self.limit_requests is not None and path not in UNLIMITED_ROUTES
        try:
            if limited and self.in_flight >= self.limit_requests:
                msg = (
                    f"the server is handling its limit of {self.limit_requests} "
                    "requests at once; retry later"
                )
                await _reply(
                    counted_send,
                    429,
                    msg,
                    headers=[(b"retry-after", b"1")],
                    request_id=rid,
                )
                return
            self.in_flight += limited
            try:
                await self._guarded(scope, receive, counted_send)
            finally:
                self.in_flight -= limited
        except Exception as err:
            # the app's handler answered (and logged) it and re-raised; uvicorn would
            # log it again as a traceback
            if not status.get("sent"):
                logger.error("request %s: unexpected error", rid, exc_info=err)
                await _reply(counted_send, 500, "internal error", request_id=rid)
        finally:
            seconds = time.perf_counter() - start
            self.metrics.requests.labels(route, str(status["code"])).inc()
            self.metrics.latency.labels(route).observe(seconds)
            # probes and scrapes come every few seconds: their lines only at debug
            access_logger.log(
                logging.DEBUG if path in UNLIMITED_ROUTES else logging.INFO,
                "%s %s %s %.1f ms request %s",
                scope.get("method", "-"),
                route,
                status["code"] if status.get("sent") else "-",
                seconds * 1000,
                rid,
            )

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
                    return  # the client left (or its body was too slow): no one to answer
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


__all__ = ["Guard", "incoming_request_id", "key_matches", "request_id"]
