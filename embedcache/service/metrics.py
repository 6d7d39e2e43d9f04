"""The service's Prometheus metrics, in a registry of their own (no global state)."""

from __future__ import annotations

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
        self.hits = Counter(
            "embedcache_cache_hits",
            "sequences answered from the store",
            ["model"],
            registry=r,
        )
        self.misses = Counter(
            "embedcache_cache_misses",
            "sequences the store lacked when their request arrived",
            ["model"],
            registry=r,
        )
        self.computed = Counter(
            "embedcache_sequences_computed",
            "distinct sequences run through the model and committed",
            ["model"],
            registry=r,
        )
        self.dropped = Counter(
            "embedcache_sequences_dropped",
            "queued sequences dropped because every client waiting for them left",
            ["model"],
            registry=r,
        )
        self.queue_seqs = Gauge(
            "embedcache_queue_sequences",
            "sequences waiting for a batch",
            ["model"],
            registry=r,
        )
        self.queue_tokens = Gauge(
            "embedcache_queue_tokens",
            "tokens waiting for a batch",
            ["model"],
            registry=r,
        )
        self.batch_tokens = Histogram(
            "embedcache_batch_tokens",
            "padded tokens per forward pass",
            ["model"],
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.forward_seconds = Histogram(
            "embedcache_forward_seconds",
            "seconds per window of batches, forward and commit",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


__all__ = ["Metrics"]
