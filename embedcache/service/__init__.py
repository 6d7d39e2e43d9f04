"""The embedding-cache service: `embedcache serve`, one HTTP front door to a store.

Split as text-embeddings-inference splits router, queue and backend:

- ``wire``: route names, media types, limits, the JSON error shape and the binary
  vector formats (Arrow IPC, NPY); light, so a client may import it too
- ``errors``: the errors a request can meet, each with its HTTP status
- ``settings``: what a server runs (models, limits, bind, keys), declared once and
  read from flags, ``EMBEDCACHE_*`` and ``serve.toml``; the key file and bind checks
- ``registry``: the served models, each one adapter and one store key
- ``fairqueue``: one queue per served model, its jobs in fair-queueing order
- ``batcher``: the thread that drains a model's queue, cutting batches across
  requests with the engine's batching rule, and blaming each failure on its cause
- ``faults``: who is at fault: the store boundary (any store error is a store
  fault), the device errors only a restart recovers from
- ``breaker``: the canary batch, the warm-up at the largest batch, and the circuit
  breaker over consecutive failed batches
- ``workers``: the bounded worker threads of the request path (503 past the bound)
- ``metrics``: the Prometheus counters, gauges and histograms
- ``guards``: ASGI middleware for request ids, the request limit, body-size limits,
  API keys and the access log
- ``connections``: uvicorn's HTTP/1.1 protocol with header and body read deadlines
- ``health``: the store probe `/health/ready` reports
- ``replies``: the routes' bodies, parsed and encoded in worker threads
- ``state``: what the routes share (models, store, queues), readiness, liveness, drain
- ``app``: the FastAPI application and its routes
- ``server``: uvicorn, signals and the graceful drain

May import the bottom floor, ``data``, ``models``, ``store`` and ``engine``; only
``cli`` imports it. FastAPI, uvicorn and prometheus-client are imported only by the
modules the server itself loads (``app``, ``server``, ``metrics``, ``guards``,
``connections``).
"""

from __future__ import annotations
