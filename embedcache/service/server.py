"""Run a server: open the store, load the models, serve on uvicorn, drain on a signal.

On SIGTERM or SIGINT the server stops accepting connections, reports not ready,
503s queued work, finishes and commits the batches in flight, answers what is
done, and returns (exit 0) within the graceful timeout. A second SIGINT forces it.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, NoReturn

import prometheus_client
import uvicorn

from embedcache.service.app import create_app
from embedcache.service.batcher import Batcher
from embedcache.service.breaker import HealthPolicy
from embedcache.service.connections import timed_protocol
from embedcache.service.health import StoreProbe
from embedcache.service.metrics import Metrics
from embedcache.service.registry import ModelRegistry, load_models
from embedcache.service.state import ServiceState

if TYPE_CHECKING:
    from types import FrameType

    from embedcache.service.settings import ServeSettings

logger = logging.getLogger(__name__)

# the exit status after a device fault only a new process recovers from
EXIT_DEVICE_LOST = 3


class _DrainingServer(uvicorn.Server):
    """uvicorn's server, draining the queues first and exiting 0 on a signal
    (uvicorn re-raises the signal it caught once it is done, which would not)."""

    def __init__(self, config: uvicorn.Config, state: ServiceState) -> None:
        super().__init__(config)
        self.state = state

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.state.begin_drain(timeout=self.config.timeout_graceful_shutdown or 0)
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True


def build_state(settings: ServeSettings) -> ServiceState:
    """Open the store and load every model once; the queues are made, not started."""
    from embedcache.store import EmbeddingStore

    # unset: the store's own default staleness
    staleness = (
        {}
        if settings.refresh_seconds is None
        else {"refresh_seconds": settings.refresh_seconds}
    )
    store = EmbeddingStore(settings.store, options=settings.store_options, **staleness)
    registry = ModelRegistry(load_models(settings.models, threads=settings.threads))
    metrics = Metrics()
    batchers = {
        model.name: Batcher(
            model,
            store,
            metrics=metrics,
            max_queue_tokens=settings.max_queue_tokens,
            window_seconds=settings.batch_window_ms / 1000,
            health=HealthPolicy(
                settings.breaker_failures,
                settings.breaker_probe_seconds,
                settings.stall_seconds,
            ),
        )
        for model in registry.models
    }
    probe = StoreProbe(
        settings.store,
        settings.store_options,
        interval=settings.store_probe_seconds,
        timeout=max(settings.store_probe_seconds, 1.0),
    )
    return ServiceState(settings, registry, store, batchers, metrics, probe=probe)


def serve(settings: ServeSettings) -> int:
    """Serve until a signal; 0 once drained."""
    state = build_state(settings)
    config = uvicorn.Config(
        create_app(state),
        host=settings.host,
        port=settings.port,
        ssl_certfile=settings.ssl_certfile,
        ssl_keyfile=settings.ssl_keyfile,
        timeout_graceful_shutdown=max(int(settings.graceful_timeout), 1),
        # admission counts requests (the Guard's limit), not uvicorn's connections;
        # the read deadlines close sockets that never finish a request
        http=timed_protocol(
            header_timeout=settings.header_timeout,
            body_timeout=settings.body_timeout,
        ),
        timeout_keep_alive=settings.keep_alive_timeout,  # type: ignore[arg-type]
        lifespan="on",
        log_config=None,  # the command's logging configuration
        access_log=False,  # the Guard's access line carries the request id
        server_header=False,
    )
    server = _DrainingServer(config, state)
    for batcher in state.batchers.values():  # a lost device: drain and exit non-zero
        batcher.on_fatal = lambda: server.handle_exit(signal.SIGTERM, None)
    scrape = None
    if settings.metrics_port is not None:
        # a thread of its own, as TEI's --prometheus-port: a scrape never waits on
        # the event loop or the request limit
        scrape, _ = prometheus_client.start_http_server(
            settings.metrics_port, addr=settings.host, registry=state.metrics.registry
        )
    try:
        server.run()
    finally:
        if scrape is not None:
            scrape.shutdown()
            scrape.server_close()
    if not server.started:
        return 1
    state.store.close()
    lost = [b.model.name for b in state.batchers.values() if b.fatal]
    if lost:
        logger.critical("stopped: the device of %s failed", lost)
        _exit_now(EXIT_DEVICE_LOST)
    logger.info("stopped")
    if state.abandoned:
        _exit_now(0)
    return 0


def _exit_now(status: int) -> NoReturn:
    """Leave without the interpreter's shutdown: it would destroy the native
    (torch) threads under a batch abandoned at the drain deadline, and the C++
    runtime aborts the process on that (SIGABRT, "terminate called without an
    active exception"). That batch's vectors were never committed; nothing stored
    is lost."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


__all__ = ["build_state", "serve"]
