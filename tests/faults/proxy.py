"""A fault-injecting HTTP proxy for the object-store tests (127.0.0.1 only).

It sits in front of moto's S3 server and, per request, by a schedule or a seeded
probability, answers with a 500 or 503, resets the connection as soon as it is
accepted (the client never reaches the server: a refused connection), forwards the
request and then resets the connection half way through the answer (the server did
the work; the client never hears it), forwards it and cuts the answer short (a
clean close right after the status line, inside the headers, or inside the body),
or stalls a few seconds before forwarding.
Every fault it injects is counted, so a test can assert that the fault happened.

Each request is forwarded on its own upstream connection with ``Connection:
close``, and each answer to the client says ``Connection: close``: one request per
client connection, so a fault at connect time hits exactly one request.
"""

from __future__ import annotations

import asyncio
import random
import re
import socket
import struct
import threading
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Self

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

# answers cut short after the server did the work: the connection closes cleanly
# (FIN, not a reset) right after the status line, half way through the headers, or
# inside the body (the answer re-sent chunked, so an empty body has framing to cut)
CUTS = ("cut-status", "cut-headers", "cut-body")
FAULTS = ("refuse", "500", "503", "reset", "stall", *CUTS)

_ERROR_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code>'
    b"<Message>injected by the test proxy</Message></Error>"
)


@dataclass
class Rule:
    """Which requests a fault may hit: a method and a regular expression searched in
    the path."""

    method: str | None = None
    path: str | None = None

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or method == self.method) and (
            self.path is None or re.search(self.path, path) is not None
        )


Head = tuple[str, str, list[str]]  # a request's method, path and header lines


class ProxyThread:
    """An asyncio server on 127.0.0.1 (a free port) in its own thread, calling
    ``handle(head, reader, writer)`` for each request whose head (method, path,
    headers) arrives; a connection closed before it is dropped."""

    def __init__(self, handle: Callable[..., Awaitable[None]], *, name: str) -> None:
        self.handle, self.name = handle, name

    async def _connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        head = await read_head(reader)
        if head is None:
            writer.close()
            return
        await self.handle(head, reader, writer)

    def start(self) -> int:
        """Serve; the port."""
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        async def serve() -> None:
            self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()

        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(serve(), self._loop)
        if not ready.wait(10):
            msg = f"{self.name} did not start"
            raise RuntimeError(msg)
        return self.port

    def stop(self) -> None:
        async def close() -> None:
            self._server.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


class ServedProxy:
    """``start()`` serves ``self.handle`` in a :class:`ProxyThread` (its port in
    ``self.port``), ``stop()`` stops it."""

    name = "a proxy"

    def start(self) -> Self:
        self._serving = ProxyThread(self.handle, name=self.name)
        self.port = self._serving.start()
        return self

    def stop(self) -> None:
        self._serving.stop()


@dataclass
class FaultProxy(ServedProxy):
    """``http://127.0.0.1:<port>`` forwarding to ``upstream`` with faults injected.

    ``schedule`` holds the faults (or None for "pass") applied, in turn, to the next
    requests that match ``rule``; once it is empty, each matching request gets a
    fault with probability ``rate`` (one of ``kinds``, drawn with ``seed``).
    """

    upstream_host: str
    upstream_port: int
    stall_s: float = 2.0
    seed: int = 0
    counts: Counter = field(default_factory=Counter)
    log: list[tuple[str, str, str]] = field(default_factory=list)  # method, path, fault
    schedule: deque = field(default_factory=deque)
    rate: float = 0.0
    kinds: tuple[str, ...] = FAULTS
    rule: Rule = field(default_factory=Rule)
    first_only: bool = False  # fault only the first request to each path
    port: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # --- control (from the test's thread) ----------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def inject(
        self,
        *faults: str | None,
        rate: float = 0.0,
        kinds: tuple[str, ...] = FAULTS,
        method: str | None = None,
        path: str | None = None,
        first_only: bool = False,
    ) -> None:
        """Plan the next faults; ``rate`` > 0 keeps injecting at random afterwards.

        ``first_only`` spares every later request to a path already asked for (a
        retry of a faulted request gets through).
        """
        unknown = {f for f in (*faults, *kinds) if f is not None} - set(FAULTS)
        if unknown:
            msg = f"unknown faults {sorted(unknown)}; known: {FAULTS}"
            raise ValueError(msg)
        with self._lock:
            self.schedule = deque(faults)
            self.rate, self.kinds = rate, kinds
            self.rule = Rule(method, path)
            self.first_only, self._seen = first_only, set()
            self._rng = random.Random(self.seed)

    def calm(self) -> None:
        """Stop injecting (what was injected stays counted)."""
        self.inject()

    def reset_counts(self) -> None:
        with self._lock:
            self.counts.clear()
            self.log.clear()

    @property
    def n_faults(self) -> int:
        return sum(n for kind, n in self.counts.items() if kind in FAULTS)

    def _choose(self, method: str, path: str) -> str | None:
        with self._lock:
            self.counts["requests"] += 1
            fault = None
            seen = (method, path) in self._seen
            self._seen.add((method, path))
            if self.rule.matches(method, path) and not (self.first_only and seen):
                if self.schedule:
                    fault = self.schedule.popleft()
                elif self.rate and self._rng.random() < self.rate:
                    fault = self._rng.choice(self.kinds)
            if fault is not None:
                self.counts[fault] += 1
                self.log.append((method, path, fault))
            return fault

    # --- serving (in the proxy's own thread) ---------------------------------------

    name = "the fault proxy"

    def start(self) -> Self:
        self._rng = random.Random(self.seed)
        self._seen: set[tuple[str, str]] = set()
        return super().start()

    async def handle(
        self, head: Head, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        method, path, headers = head
        fault = self._choose(method, path)
        if fault == "refuse":
            _abort(writer)  # before reading the body: the server never sees it
            return
        body = await read_body(reader, headers)
        if fault in ("500", "503"):
            code = b"InternalError" if fault == "500" else b"SlowDown"
            payload = _ERROR_BODY % code
            reason = (
                "Internal Server Error" if fault == "500" else "Service Unavailable"
            )
            writer.write(
                f"HTTP/1.1 {fault} {reason}\r\nContent-Type: application/xml\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
                + payload
            )
            await close_writer(writer)
            return
        if fault == "stall":
            await asyncio.sleep(self.stall_s)
        answer = await forward(
            self.upstream_host, self.upstream_port, method, path, headers, body
        )
        if fault == "reset":
            writer.write(answer[: max(1, len(answer) // 2)])
            await writer.drain()
            _abort(writer)
            return
        if fault in CUTS:
            writer.write(_cut(answer, fault))
            await close_writer(writer)
            return
        writer.write(answer)
        await close_writer(writer)


async def read_head(
    reader: asyncio.StreamReader,
) -> Head | None:
    """A request's method, path and header lines (None if the client left)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    return method, path, [ln for ln in lines[1:] if ln]


async def read_body(reader: asyncio.StreamReader, headers: list[str]) -> bytes:
    """The request body its ``Content-Length`` announces."""
    length = 0
    for line in headers:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    return await reader.readexactly(length) if length else b""


async def forward(
    host: str, port: int, method: str, path: str, headers: list[str], body: bytes
) -> bytes:
    """The whole answer of ``host:port`` to the request, said with ``Connection:
    close`` on both sides (one request per connection)."""
    kept = [
        h
        for h in headers
        if h.partition(":")[0].strip().lower() not in ("connection", "keep-alive")
    ]
    request = "\r\n".join([f"{method} {path} HTTP/1.1", *kept, "Connection: close"])
    up_reader, up_writer = await asyncio.open_connection(host, port)
    try:
        up_writer.write(request.encode("latin-1") + b"\r\n\r\n" + body)
        await up_writer.drain()
        answer = await up_reader.read(-1)
    finally:
        up_writer.close()
    return _force_close(answer)


def _force_close(answer: bytes) -> bytes:
    """The answer with ``Connection: close`` (one request per client connection)."""
    head, sep, rest = answer.partition(b"\r\n\r\n")
    lines = [
        ln
        for ln in head.split(b"\r\n")
        if ln.partition(b":")[0].strip().lower() not in (b"connection", b"keep-alive")
    ]
    return b"\r\n".join([*lines, b"Connection: close"]) + sep + rest


def _cut(answer: bytes, where: str) -> bytes:
    """The first bytes of ``answer``, ending at the cut point ``where``."""
    head, _, body = answer.partition(b"\r\n\r\n")
    status, _, fields = head.partition(b"\r\n")
    if where == "cut-status":
        return status + b"\r\n"
    if where == "cut-headers":
        return status + b"\r\n" + fields[: max(1, len(fields) // 2)]
    kept = [
        ln
        for ln in fields.split(b"\r\n")
        if ln.partition(b":")[0].strip().lower()
        not in (b"content-length", b"transfer-encoding")
    ]
    chunked = b"\r\n".join([status, *kept, b"Transfer-Encoding: chunked"])
    # half of the one chunk; or, for no body, the last chunk without its blank line
    part = b"%x\r\n" % len(body) + body[: len(body) // 2] if body else b"0\r\n"
    return chunked + b"\r\n\r\n" + part


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), not a clean FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def close_writer(writer: asyncio.StreamWriter) -> None:
    try:
        await writer.drain()
    finally:
        writer.close()


def start_proxy(endpoint: str, **kwargs: float) -> FaultProxy:
    """A started proxy in front of ``http://host:port``."""
    host, _, port = endpoint.removeprefix("http://").partition(":")
    return FaultProxy(host, int(port), **kwargs).start()


__all__ = [
    "CUTS",
    "FAULTS",
    "FaultProxy",
    "ProxyThread",
    "close_writer",
    "forward",
    "read_body",
    "read_head",
    "start_proxy",
]
