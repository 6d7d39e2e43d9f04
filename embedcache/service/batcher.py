"""One thread per served model, draining its queue in batches across requests.

The thread takes a window of the model's :class:`~embedcache.service.fairqueue.
FairQueue` and cuts it into length-sorted forward passes with the engine's own
rule (:func:`~embedcache.engine.batching.plan_batches`). Each pass runs through
:func:`~embedcache.engine.forward.run_unit`, the forward-and-commit step of
`embedcache embed`, so a vector is committed to the store before any request that
waits for it is answered, and requests are answered pass by pass. Between two
passes of a window, the passes left go back to the queue when a queued sequence is
due before all of them.

Failures stay with their cause (:mod:`embedcache.service.faults`): whatever the
store raises fails its pass or window with a store fault (503, or 500
``store_corrupt``). A pass the model fails is run again with a canary batch: if the
canary fails too, the backend is at fault (424, and the :class:`Breaker` counts it);
if it passes, the pass is halved and rerun down to the one sequence to blame, which
alone fails (422; by digest, each request names its own index). Each is logged once
with the requests' ids; a failed request's queued jobs are dropped. After a few
backend faults in a row the breaker opens: queued work gets 503, the model is not
ready, and the thread runs the canary every few seconds until it passes. A device
error only a new process recovers from, or a failed warm-up, ends the thread and
calls :attr:`Batcher.on_fatal` (the server exits non-zero). Should the thread stop
otherwise, :attr:`Batcher.alive` turns false and every waiting request gets 503.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from embedcache.engine.batching import plan_batches
from embedcache.engine.forward import run_unit
from embedcache.engine.plan import WorkUnit, adapter_keys
from embedcache.errors import EmbedcacheError
from embedcache.service.breaker import (
    Breaker,
    HealthPolicy,
    canary_batch,
    forward_checked,
    warm_up_batch,
)
from embedcache.service.errors import (
    BackendFaultError,
    RequestError,
    SequenceFailedError,
    ServerFaultError,
    ServiceUnavailableError,
)
from embedcache.service.fairqueue import FairQueue, Job, Ticket
from embedcache.service.faults import guarded, is_fatal_device_error

if TYPE_CHECKING:
    from collections.abc import Callable

    from embedcache.service.metrics import Metrics
    from embedcache.service.registry import ServedModel
    from embedcache.store import EmbeddingStore

logger = logging.getLogger(__name__)


class _DeviceLost(Exception):
    """The device failed in a way only a new process recovers from."""


class Batcher:
    """The queue of one served model and the thread that drains it."""

    def __init__(
        self,
        model: ServedModel,
        store: EmbeddingStore,
        *,
        metrics: Metrics,
        max_queue_tokens: int,
        window_seconds: float = 0.002,
        health: HealthPolicy = HealthPolicy(),  # noqa: B008 (frozen)
    ) -> None:
        self.model = model
        self.store = guarded(store)
        self.metrics = metrics
        self.queue = FairQueue(
            model.name,
            model.rule,
            metrics=metrics,
            max_queue_tokens=max_queue_tokens,
            window_seconds=window_seconds,
            refusal=self._refusal,
        )
        self.breaker = Breaker(
            failures=health.failures, probe_seconds=health.probe_seconds
        )
        self.stall_seconds = health.stall_seconds
        self.warm = False  # the warm-up forward passed
        self.fatal: str | None = None  # why the device cannot go on
        # called (from the thread) after a fatal device error: the server exits
        self.on_fatal: Callable[[], None] | None = None
        self._busy_since: float | None = None  # monotonic start of the step running
        self._thread = threading.Thread(
            target=self._run, name=f"batcher-{model.name}", daemon=True
        )

    # --- requests' side -------------------------------------------------------------

    def submit(self, *args: Any, **kwargs: Any) -> Ticket:  # noqa: ANN401
        """:meth:`FairQueue.submit <embedcache.service.fairqueue.FairQueue.submit>`;
        503 while the breaker is open."""
        return self.queue.submit(*args, **kwargs)

    def cancel(self, ticket: Ticket) -> int:
        """Drop a gone request's queued, not yet computed work (others' stays);
        return how many sequences left the queue."""
        return self.queue.cancel(ticket)

    @property
    def alive(self) -> bool:
        """Whether the thread runs and takes work (false once it stopped for any
        reason: the server is then not ready)."""
        return self._thread.is_alive() and not self.queue.dead

    @property
    def live(self) -> bool:
        """Whether the thread runs and its step in flight (a pass, a canary) has not
        run longer than ``stall_seconds``: false means restart me."""
        since = self._busy_since
        stalled = since is not None and time.monotonic() - since > self.stall_seconds
        return self.alive and not stalled

    def trouble(self) -> str | None:
        """Why the model should take no traffic now (not ready), or None."""
        name = self.model.name
        if self.fatal is not None:
            return f"the device of {name!r} failed: {self.fatal}"
        if not self.alive:
            return f"the queue of {name!r} stopped"
        if not self.warm:
            return f"{name!r} is warming up"
        if self.breaker.open:
            return (
                f"{name!r} failed {self.breaker.n_failed} batches and a canary batch; "
                f"its canary runs every {self.breaker.probe_seconds:g} s"
            )
        return None

    def _refusal(self) -> Exception | None:
        """Why the queue takes no new work now: the breaker is open."""
        if not self.breaker.open:
            return None
        return ServiceUnavailableError(
            self.trouble() or "", retry_after=self._probe_wait()
        )

    def _probe_wait(self) -> int:
        return max(1, round(self.breaker.probe_seconds))

    @property
    def depth(self) -> tuple[int, int]:
        """Queued (not yet running) sequences and their tokens."""
        return self.queue.depth

    # --- lifecycle ----------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Take no more work; the pass in flight is finished and committed, every
        queued job's requests (the rest of its window too) get 503."""
        self.queue.stop()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread; whether it ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # --- the thread -----------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._warm_up()
            while True:
                if self.breaker.open:
                    if not self._probe():
                        return
                    continue
                window = self._take_window()
                if window is None:
                    return
                try:
                    self._compute(window)
                except _DeviceLost:
                    raise
                except Exception as err:  # noqa: BLE001 (one window's fault, logged)
                    self._fail(self.queue.unanswered(window), err)
                finally:
                    self._busy_since = None
        except _DeviceLost as lost:
            self._lose_device(lost)
        except Exception:  # logged once here; the requests get 503 below
            logger.exception("%s: the queue's thread stopped", self.model.name)
        finally:
            self.queue.close()

    def _warm_up(self) -> None:
        """A forward pass at the largest batch before the first ready: out of memory
        (or any failure) shows now, and ends the server, not a request later."""
        seqs = warm_up_batch(self.model.adapter, self.model.rule)
        self._busy_since = time.monotonic()
        try:
            forward_checked(self.model.adapter, seqs)
        except Exception as err:
            msg = f"the warm-up forward pass of {len(seqs)} sequences failed: {err}"
            raise _DeviceLost(msg) from err
        finally:
            self._busy_since = None
        self.warm = True
        logger.info("%s: warmed up (%d sequences)", self.model.name, len(seqs))

    def _canary(self) -> bool:
        """Whether a known-good batch passes on the model now (not stored)."""
        self._busy_since = self._busy_since or time.monotonic()
        try:
            forward_checked(self.model.adapter, canary_batch(self.model.adapter))
        except Exception as err:
            if is_fatal_device_error(err):
                raise _DeviceLost(str(err)) from err
            logger.warning("%s: the canary batch failed: %s", self.model.name, err)
            return False
        return True

    def _probe(self) -> bool:
        """While the breaker is open: wait, run the canary, close on a pass; false
        once the server stops."""
        if self.queue.wait_stop(self.breaker.probe_seconds):
            return False
        try:
            if self._canary():
                self.breaker.passed()
                logger.info("%s: the canary passed; ready again", self.model.name)
        finally:
            self._busy_since = None
        return True

    def _lose_device(self, lost: _DeviceLost) -> None:
        """A fault only a new process recovers from: every waiting request gets 424,
        and the server is told to exit (non-zero)."""
        self.fatal = str(lost)
        logger.critical(
            "%s: the device cannot go on, exiting: %s", self.model.name, lost
        )
        error = BackendFaultError(
            "the model's device failed; this replica is restarting, retry another"
        )
        self.queue.refuse()
        self.queue.finish(self.queue.pending(), error=error)
        if self.on_fatal is not None:
            self.on_fatal()

    def _take_window(self) -> list[Job] | None:
        return self.queue.take_window()

    def _compute(self, window: list[Job]) -> None:
        """Run a window pass by pass, committing and answering after each; the passes
        not begun go back to the queue when a queued sequence is due before all of
        them, or on a shutdown (and then get 503)."""
        if not window:
            return
        digests = [job.digest for job in window]
        # another writer (an `embed` run, a second server) may have stored some meanwhile
        stored = np.ones(len(window), dtype=bool)
        for key in adapter_keys(self.model.adapter):
            stored &= np.asarray(self.store.contains(key, digests), dtype=bool)
        self.queue.finish(
            [job for job, done in zip(window, stored, strict=True) if done]
        )
        todo = [job for job, done in zip(window, stored, strict=True) if not done]
        batches = plan_batches([job.tokens for job in todo], self.model.rule)
        for number, batch in enumerate(batches):
            if self.breaker.open:  # its queued work got 503 as it opened
                return
            jobs = self.queue.still_wanted([todo[i] for i in batch])
            if jobs:
                self._forward_or_split(jobs)
            rest = [todo[i] for later in batches[number + 1 :] for i in later]
            if rest and self.queue.hand_back(rest):
                return

    def _forward_or_split(self, jobs: list[Job]) -> None:
        """Forward and commit ``jobs``. A store fault fails them; a model failure
        the canary shares is the backend's; else each half runs again, so only the
        sequence to blame fails."""
        try:
            self._forward(jobs)
        except ServerFaultError as err:  # the store's: the boundary decided
            self._fail(jobs, err)
            return
        except Exception as err:
            if is_fatal_device_error(err):
                raise _DeviceLost(str(err)) from err
            if not self._canary():
                self._backend_failed(jobs, err)
                return
            if len(jobs) == 1:
                kind = type(err).__name__
                self._fail(jobs, SequenceFailedError(jobs[0].digest, kind), cause=err)
                return
            half = len(jobs) // 2
            for part in (jobs[:half], jobs[half:]):
                part = self.queue.still_wanted(part)
                if part:
                    self._forward_or_split(part)
        else:
            self.breaker.passed()
            self.queue.finish(jobs)

    def _backend_failed(self, jobs: list[Job], err: Exception) -> None:
        """424 for a pass the canary failed too; past the breaker's count, queued
        work gets 503 and the model turns not ready."""
        error = BackendFaultError(
            "the model's backend failed on this batch and on a known-good one; "
            "retry later or against another replica"
        )
        self._fail(jobs, error, cause=err)
        if not self.breaker.failed():
            return
        logger.error("%s: not ready: %s", self.model.name, self.trouble())
        busy = ServiceUnavailableError(
            self.trouble() or "", retry_after=self._probe_wait()
        )
        self.queue.finish(self.queue.pending(), error=busy)

    def _fail(
        self, jobs: list[Job], err: Exception, *, cause: Exception | None = None
    ) -> None:
        """Fail ``jobs`` (all of a pass or window) with the error their requests may
        see (a service error as decided, anything else a generic 500), logging its
        cause once with their request ids."""
        ids = self.queue.request_ids(jobs)
        error = (
            err
            if isinstance(err, RequestError)
            else ServerFaultError("the server failed computing this request")
        )
        cause = cause or err.__cause__ or err
        logger.error(
            "%s: %d sequences failed (requests %s): %s",
            self.model.name,
            len(jobs),
            ", ".join(ids),
            cause,
            exc_info=None if isinstance(cause, EmbedcacheError | OSError) else cause,
        )
        self.queue.finish(jobs, error=error)

    def _forward(self, jobs: list[Job]) -> None:
        """One forward pass over ``jobs``, committed to the store."""
        model = self.model
        tokens = tuple(job.tokens for job in jobs)
        unit = WorkUnit(
            index=0,
            seqs=tuple(job.seq for job in jobs),
            hashes=tuple(job.digest for job in jobs),
            tokens=tokens,
            batches=(tuple(range(len(jobs))),),
        )
        start = time.perf_counter()
        self._busy_since = time.monotonic()
        result = run_unit(model.adapter, self.store, unit)
        seconds = time.perf_counter() - start
        metrics = self.metrics
        metrics.observe_stage(model.name, "forward", result.forward_seconds)
        metrics.observe_stage(model.name, "commit", result.commit_seconds)
        metrics.computed.labels(model.name).inc(result.n_computed)
        metrics.forward_seconds.labels(model.name).observe(seconds)
        padded = len(jobs) * max(tokens)
        metrics.batch_tokens.labels(model.name).observe(padded)
        self.queue.advance(padded)
        logger.debug(
            "%s: a batch of %d sequences, %.3f s", model.name, len(jobs), seconds
        )


__all__ = ["Batcher", "Ticket"]
