"""What a server's routes share: settings, models, store, queues, metrics, and the
readiness, liveness and drain that follow from them."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from embedcache.service.workers import WorkerThreads

if TYPE_CHECKING:
    from embedcache.service.batcher import Batcher
    from embedcache.service.health import StoreProbe
    from embedcache.service.metrics import Metrics
    from embedcache.service.registry import ModelRegistry
    from embedcache.service.settings import ServeSettings
    from embedcache.store import EmbeddingStore

logger = logging.getLogger(__name__)


@dataclass
class ServiceState:
    """What the routes share: settings, models, store, queues, metrics, readiness."""

    settings: ServeSettings
    registry: ModelRegistry
    store: EmbeddingStore
    batchers: dict[str, Batcher]
    metrics: Metrics
    probe: StoreProbe | None = None
    ready: bool = False
    draining: bool = False
    deadline: float | None = field(default=None)
    # models whose batch was still running at the drain deadline
    abandoned: list[str] = field(default_factory=list)
    workers: WorkerThreads = field(init=False)

    def __post_init__(self) -> None:
        self.workers = WorkerThreads(self.settings.worker_threads)

    def readiness(self) -> str | None:
        """None when ready; else why not."""
        if self.draining:
            return "draining"
        if not self.ready:
            return "starting"
        for batcher in self.batchers.values():
            trouble = batcher.trouble()  # stopped, warming up, or its breaker open
            if trouble is not None:
                return trouble
        if self.probe is not None and not self.probe.ok:
            return "the store did not answer its last probe"
        return None

    def liveness(self) -> str | None:
        """None when live; else why a restart is due (a queue's thread dead or
        stuck in one step longer than any pass may take)."""
        stuck = [name for name, b in self.batchers.items() if not b.live]
        if stuck and not self.draining:
            return f"the queue of {stuck} stopped or made no progress"
        return None

    def begin_drain(self, *, timeout: float) -> None:
        """Stop taking work: not ready, queued work 503, the batch in flight finishes."""
        if self.draining:
            return
        logger.info(
            "draining: finishing the batches in flight (at most %.0f s)", timeout
        )
        self.draining = True
        self.ready = False
        self.deadline = time.monotonic() + timeout
        for batcher in self.batchers.values():
            batcher.stop()

    def join(self) -> None:
        """Wait for the batcher threads, until the drain deadline."""
        for batcher in self.batchers.values():
            batcher.stop()
            left = (
                None
                if self.deadline is None
                else max(self.deadline - time.monotonic(), 0.0)
            )
            if not batcher.join(left):
                self.abandoned.append(batcher.model.name)
                logger.error(
                    "%s: a batch was still running at the drain deadline",
                    batcher.model.name,
                )
