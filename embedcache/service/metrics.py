"""The service's Prometheus metrics, in a registry of their own (no global state).

Per-stage latency, ``embedcache_stage_seconds{model, stage}``, splits where a
request's time goes; the stages (:data:`STAGES`) are observed by whoever runs them
through :meth:`Metrics.observe_stage`:

- ``tokenise``: a request's plan before the queue: its sequences checked, hashed,
  token-counted by the model's tokeniser and looked up in the store;
- ``queue``: a missing sequence's wait from its request's arrival in the queue to
  the start of its batch;
- ``forward``: one batch through the model (its tokenisation included);
- ``commit``: one batch's vectors written to the store;
- ``encode``: a reply's body built (JSON, Arrow or NPY).
"""

from __future__ import annotations

from typing import TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

# request latency: a cached one-sequence request is ~ms, a 10,000-sequence miss minutes
_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
)
_TOKEN_BUCKETS = tuple(2**i for i in range(4, 22))


_PER_MODEL_HELP = {
    "embedcache_cache_hits": "sequences answered from the store",
    "embedcache_cache_misses": "sequences the store lacked when their request arrived",
    "embedcache_sequences_computed": "distinct sequences run through the model and "
    "committed",
    "embedcache_sequences_dropped": "queued sequences dropped because every client "
    "waiting for them left",
    "embedcache_queue_sequences": "sequences waiting for a batch",
    "embedcache_queue_tokens": "tokens waiting for a batch",
    "embedcache_batch_tokens": "padded tokens per forward pass",
    "embedcache_forward_seconds": "seconds per forward pass (one batch), forward and commit",
}
_Metric = TypeVar("_Metric", Counter, Gauge, Histogram)
STAGES = ("tokenise", "queue", "forward", "commit", "encode")


class Metrics:
    """Counters, gauges and histograms of one server, exposed at /metrics."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "embedcache_requests",
            "HTTP requests by route and status",
            ["route", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "embedcache_request_seconds",
            "request latency by route",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.hits = self._per_model(Counter, "embedcache_cache_hits")
        self.misses = self._per_model(Counter, "embedcache_cache_misses")
        self.computed = self._per_model(Counter, "embedcache_sequences_computed")
        self.dropped = self._per_model(Counter, "embedcache_sequences_dropped")
        self.queue_seqs = self._per_model(Gauge, "embedcache_queue_sequences")
        self.queue_tokens = self._per_model(Gauge, "embedcache_queue_tokens")
        self.batch_tokens = self._per_model(
            Histogram, "embedcache_batch_tokens", buckets=_TOKEN_BUCKETS
        )
        self.forward_seconds = self._per_model(
            Histogram, "embedcache_forward_seconds", buckets=_LATENCY_BUCKETS
        )
        self.stage_seconds = Histogram(
            "embedcache_stage_seconds",
            f"seconds per stage of serving, by model and stage ({', '.join(STAGES)})",
            ["model", "stage"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

    def _per_model(
        self, kind: type[_Metric], name: str, **options: tuple[float, ...]
    ) -> _Metric:
        """A metric labelled by model, with its help from ``_PER_MODEL_HELP``."""
        return kind(
            name, _PER_MODEL_HELP[name], ["model"], registry=self.registry, **options
        )

    def observe_stage(self, model: str, stage: str, seconds: float) -> None:
        """Record that ``stage`` (one of :data:`STAGES`) took ``seconds`` for
        ``model``: once a request (tokenise, encode), a sequence (queue) or a batch
        (forward, commit).

        Raises
        ------
        ValueError
            ``stage`` is not one of :data:`STAGES`.
        """
        if stage not in STAGES:
            msg = f"stage {stage!r} is not one of {STAGES}"
            raise ValueError(msg)
        self.stage_seconds.labels(model, stage).observe(seconds)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


__all__ = ["STAGES", "Metrics"]
