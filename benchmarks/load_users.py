"""The locustfile of benchmarks/serve_load.py: embedcache clients, 90% hits / 10% misses.

Each request holds 1-256 sequences (uniform); a hit request asks sequences of the pool
the benchmark stored first (the file ``$EMBEDCACHE_LOAD_POOL`` names), a miss request
new random 200-500 bp sequences, sent as the Python client sends them (``POST
/v1/embed``, Arrow answers). A hit whose answer says it computed anything, or any
answer but 200, is a failure. Its own module: importing locust patches the process
(gevent), which the benchmark's driver must not be.
"""

from __future__ import annotations

import os
import random

from locust import FastHttpUser, constant, task

ROUTE = "/v1/embed"
ARROW = "application/vnd.apache.arrow.stream"
MAX_PER_REQUEST = 256
POOL_ENV = "EMBEDCACHE_LOAD_POOL"  # the file of hit sequences, one a line


class EmbedUser(FastHttpUser):
    """A client in a closed loop: 9 hit requests to 1 miss request."""

    wait_time = constant(0)
    # a miss request of 256 sequences computes for seconds, longer on a busy machine
    network_timeout = connection_timeout = 900.0
    _pool: list[str] | None = None

    def on_start(self) -> None:
        if EmbedUser._pool is None:
            with open(os.environ[POOL_ENV]) as f:  # noqa: PTH123 (locust's process)
                EmbedUser._pool = f.read().split()
        self.rng = random.Random()

    def _post(self, seqs: list[str], name: str) -> None:
        with self.client.post(
            ROUTE,
            json={"model": "bench", "sequences": seqs},
            headers={"Accept": ARROW},
            name=name,
            catch_response=True,
        ) as reply:
            if reply.status_code != 200:
                reply.failure(f"status {reply.status_code}")
            elif name == "hit" and reply.headers.get("X-Embedcache-Computed") != "0":
                reply.failure("a hit was computed")

    @task(9)
    def hit(self) -> None:
        n = self.rng.randint(1, MAX_PER_REQUEST)
        self._post(self.rng.choices(self._pool, k=n), "hit")

    @task(1)
    def miss(self) -> None:
        n = self.rng.randint(1, MAX_PER_REQUEST)
        seqs = [
            "".join(self.rng.choices("ACGT", k=self.rng.randint(200, 500)))
            for _ in range(n)
        ]
        self._post(seqs, "miss")
