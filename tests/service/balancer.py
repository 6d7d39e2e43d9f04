"""A round-robin HTTP load balancer in front of `embedcache serve` replicas (127.0.0.1).

It does what nginx's ``upstream`` block does with ``proxy_next_upstream error``: each
request goes to the next replica in turn; a replica that refuses the connection (it
died) is skipped and the request goes to the next; a replica that dies after the
request reached it gives the client a 502, which the client retries (an embedding
request is idempotent: the store is content-addressed). One request per client
connection, as in tests/faults/proxy.py, whose pieces it reuses.

Run alone (the load benchmark does): ``python -m tests.service.balancer --port P
URL URL ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import signal
import threading
from collections import Counter

from tests.faults.proxy import Head, ServedProxy, close_writer, forward, read_body

_BAD_GATEWAY = (
    b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
)


class RoundRobinProxy(ServedProxy):
    """``http://127.0.0.1:<port>`` spreading requests over ``upstreams`` in turn."""

    name = "the round-robin proxy"

    def __init__(self, upstreams: list[str]) -> None:
        self.upstreams = [
            (host, int(port))
            for host, _, port in (
                u.removeprefix("http://").rstrip("/").partition(":") for u in upstreams
            )
        ]
        self._turn = itertools.cycle(range(len(self.upstreams)))
        self.counts: Counter = Counter()  # requests answered, per upstream index
        self._lock = threading.Lock()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(
        self, head: Head, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        method, path, headers = head
        try:
            body = await read_body(reader, headers)
            answer = await self._answer(method, path, headers, body)
        except asyncio.CancelledError:  # the proxy stops: drop the connection
            writer.close()
            return
        writer.write(answer)
        await close_writer(writer)

    async def _answer(
        self, method: str, path: str, headers: list[str], body: bytes
    ) -> bytes:
        with self._lock:
            first = next(self._turn)
        n = len(self.upstreams)
        for i in (first + k for k in range(n)):
            host, port = self.upstreams[i % n]
            try:
                answer = await forward(host, port, method, path, headers, body)
            except ConnectionRefusedError:
                continue  # dead before it saw the request: the next one gets it
            except (ConnectionError, OSError):
                break  # it had the request and died: the client decides
            if not answer:
                break
            with self._lock:
                self.counts[i % n] += 1
            return answer
        payload = b'{"error":{"message":"no replica answered","type":"bad_gateway"}}'
        return _BAD_GATEWAY % (len(payload), payload)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("upstreams", nargs="+")
    args = parser.parse_args()
    proxy = RoundRobinProxy(args.upstreams)

    async def run() -> None:
        server = await asyncio.start_server(proxy.handle, "127.0.0.1", args.port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with server:
            await stop.wait()

    asyncio.run(run())


if __name__ == "__main__":
    main()
