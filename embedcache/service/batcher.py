"""One queue per served model, drained by one thread that batches across requests.

Requests enqueue the distinct sequences the store lacks; the same sequence asked for
by several requests in flight is one job with several waiters, so it is computed
once. The thread takes a window of the queued sequences in tag order (below), at
most :data:`WINDOW_BUDGETS` token budgets, and cuts it into length-sorted forward
passes with the engine's own rule
(:func:`~embedcache.engine.batching.plan_batches`). Each pass runs through
:func:`~embedcache.engine.forward.run_unit`, the forward-and-commit step of
`embedcache embed`, so a vector is committed to the store before any request that
waits for it is answered, and requests are answered pass by pass.

Order: fair queueing on a work clock. The clock counts the work computed, in token
budgets (a pass's padded tokens over the budget). A request's sequences are cut into
the passes the engine would make of that request alone (short sequences first), and
each sequence is tagged with the clock at the request's arrival plus the request's
tokens up to and including its pass, over the budget: the clock reading by which a
fair share would have computed it. The queue goes by tag (then first come, first
served). So a one-sequence request arriving beside a stream of large ones is tagged
just after the clock, ahead of the stream's next pass: between two passes of a
window, a queued sequence tagged before every pass left hands those passes back to
the queue, and it waits only for the pass in flight and its own. A flow of small
requests cannot starve a large one either: each pass moves the clock on, so the
large one's next pass comes due after one budget of their work.

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

import concurrent.futures
import heapq
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from embedcache.engine.batching import plan_batches
from embedcache.engine.forward import run_unit
from embedcache.engine.plan import WorkUnit, adapter_keys
from embedcache.errors import EmbedcacheError
from embedcache.service.breaker import (
    Breaker,
    canary_batch,
    forward_checked,
    warm_up_batch,
)
from embedcache.service.errors import (
    BackendFaultError,
    QueueFullError,
    RequestError,
    RequestTooLargeError,
    SequenceFailedError,
    ServerFaultError,
    ServiceUnavailableError,
)
from embedcache.service.faults import guarded, is_fatal_device_error

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from embedcache.service.metrics import Metrics
    from embedcache.service.registry import ServedModel
    from embedcache.store import EmbeddingStore

logger = logging.getLogger(__name__)

# A window spans at most this many token budgets, taken in tag order: concurrent
# requests' sequences are then sorted by length across requests, as one `embed` run
# sorts its input, instead of padding short and long ones together batch by batch ...
WINDOW_BUDGETS = 8
# ... of sequences due within one budget of the first: what is due later waits for
# the next window, so a small request's sequence is not sorted in behind them
WINDOW_SPAN = 1.0


class Ticket:
    """One request's share of the queue: done when every sequence it waits for is
    stored (``future`` resolves), or failed with the error that stopped it."""

    def __init__(self, digests: Sequence[str], request_id: str = "-") -> None:
        self.request_id = request_id
        self.remaining = set(digests)
        self.future: concurrent.futures.Future[None] = concurrent.futures.Future()
        if not self.remaining:
            self.future.set_result(None)


@dataclass(eq=False)
class _Job:
    digest: str
    seq: str
    tokens: int
    priority: tuple[float, int, int]  # (tag, request, position)
    waiters: set[Ticket] = field(default_factory=set)
    running: bool = False


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
        breaker_failures: int = 3,
        breaker_probe_seconds: float = 5.0,
        stall_seconds: float = 600.0,
    ) -> None:
        self.model = model
        self.store = guarded(store)
        self.metrics = metrics
        self.max_queue_tokens = max_queue_tokens
        self.window_seconds = window_seconds
        self.breaker = Breaker(
            failures=breaker_failures, probe_seconds=breaker_probe_seconds
        )
        self.stall_seconds = stall_seconds
        self.warm = False  # the warm-up forward passed
        self.fatal: str | None = None  # why the device cannot go on
        # called (from the thread) after a fatal device error: the server exits
        self.on_fatal: Callable[[], None] | None = None
        self._busy_since: float | None = None  # monotonic start of the step running
        self._cond = threading.Condition()
        self._jobs: dict[str, _Job] = {}
        self._heap: list[tuple[tuple[float, int, int], int, _Job]] = []
        self._counter = itertools.count()
        self._tickets = itertools.count()
        self._queued_seqs = 0
        self._queued_tokens = 0
        self._stopping = False
        self._dead = False  # the thread ended (a drain, or a fault outside the guard)
        self._clock = 0.0  # token budgets of work computed so far
        self._thread = threading.Thread(
            target=self._run, name=f"batcher-{model.name}", daemon=True
        )

    # --- requests' side -------------------------------------------------------------

    def submit(
        self,
        seqs: Sequence[str],
        digests: Sequence[str],
        tokens: Sequence[int],
        *,
        request_id: str = "-",
    ) -> Ticket:
        """Queue the distinct sequences a request lacks; join jobs already queued.

        Raises
        ------
        RequestTooLargeError
            The request alone holds more tokens than the queue may.
        QueueFullError
            The queue is too full to take it now (429: retry later).
        ServiceUnavailableError
            The server is draining, or the queue's thread stopped.
        """
        # how far into the request each sequence's pass ends, in token budgets: the
        # passes the engine would cut for this request alone
        budget = self.model.rule.token_budget
        due = np.empty(len(digests), dtype=np.float64)
        work = 0
        for batch in plan_batches(tokens, self.model.rule):
            work += len(batch) * max(tokens[i] for i in batch)
            due[batch] = work / budget
        with self._cond:
            if self._stopping or self._dead:
                raise ServiceUnavailableError(self._unavailable())
            if self.breaker.open:
                raise ServiceUnavailableError(
                    self.trouble() or "", retry_after=self._probe_wait()
                )
            new = [i for i, d in enumerate(digests) if d not in self._jobs]
            new_tokens = sum(tokens[i] for i in new)
            if new_tokens > self.max_queue_tokens:
                msg = (
                    f"the request needs {new_tokens} tokens computed, more than the "
                    f"queue limit of {self.max_queue_tokens} tokens of {self.model.name!r}; "
                    "split it into smaller requests"
                )
                raise RequestTooLargeError(msg)
            if new and self._queued_tokens + new_tokens > self.max_queue_tokens:
                msg = (
                    f"the queue of {self.model.name!r} holds {self._queued_tokens} tokens "
                    f"and its limit is {self.max_queue_tokens}; this request adds "
                    f"{new_tokens}. Retry later"
                )
                raise QueueFullError(msg, retry_after=1)
            ticket = Ticket(digests, request_id)
            number = next(self._tickets)
            for i, digest in enumerate(digests):
                job = self._jobs.get(digest)
                priority = (self._clock + float(due[i]), number, i)
                if job is None:
                    job = _Job(digest, seqs[i], tokens[i], priority)
                    self._jobs[digest] = job
                    self._queued_seqs += 1
                    self._queued_tokens += tokens[i]
                    self._push(job)
                elif not job.running and priority < job.priority:
                    job.priority = priority
                    self._push(job)
                job.waiters.add(ticket)
            self._publish_depth()
            self._cond.notify()
        return ticket

    def cancel(self, ticket: Ticket) -> int:
        """Drop a gone request's queued, not yet computed work (others' stays);
        return how many sequences left the queue."""
        with self._cond:
            dropped = self._release(ticket)
            self._publish_depth()
        if dropped:
            self.metrics.dropped.labels(self.model.name).inc(dropped)
            logger.info(
                "%s: dropped %d queued sequences of a gone client",
                self.model.name,
                dropped,
            )
        return dropped

    def _release(self, ticket: Ticket) -> int:
        """Take ``ticket`` off its jobs (the lock held); drop the queued jobs nobody
        else waits for and return how many."""
        dropped = 0
        for digest in list(ticket.remaining):
            job = self._jobs.get(digest)
            if job is None:
                continue
            job.waiters.discard(ticket)
            if not job.waiters and not job.running:
                self._forget(job)
                dropped += 1
        ticket.remaining.clear()
        return dropped

    @property
    def alive(self) -> bool:
        """Whether the thread runs and takes work (false once it stopped for any
        reason: the server is then not ready)."""
        return self._thread.is_alive() and not self._dead

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

    def _probe_wait(self) -> int:
        return max(1, round(self.breaker.probe_seconds))

    @property
    def depth(self) -> tuple[int, int]:
        """Queued (not yet running) sequences and their tokens."""
        with self._cond:
            return self._queued_seqs, self._queued_tokens

    # --- lifecycle ----------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Take no more work; the pass in flight is finished and committed, every
        queued job's requests (the rest of its window too) get 503."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread; whether it ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # --- the thread -----------------------------------------------------------------

    def _push(self, job: _Job) -> None:
        heapq.heappush(self._heap, (job.priority, next(self._counter), job))

    def _forget(self, job: _Job) -> None:
        del self._jobs[job.digest]
        if not job.running:
            self._queued_seqs -= 1
            self._queued_tokens -= job.tokens

    def _publish_depth(self) -> None:
        self.metrics.queue_seqs.labels(self.model.name).set(self._queued_seqs)
        self.metrics.queue_tokens.labels(self.model.name).set(self._queued_tokens)

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
                    with self._cond:  # its jobs not answered nor handed back
                        jobs = [j for j in window if self._jobs.get(j.digest) is j]
                    self._fail([j for j in jobs if j.running], err)
                finally:
                    self._busy_since = None
        except _DeviceLost as lost:
            self._lose_device(lost)
        except Exception:  # logged once here; the requests get 503 below
            logger.exception("%s: the queue's thread stopped", self.model.name)
        finally:
            with self._cond:
                self._dead = True
                self._fail_waiting(running=True)

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
        with self._cond:
            self._cond.wait_for(lambda: self._stopping, self.breaker.probe_seconds)
            if self._stopping:
                self._fail_waiting(running=False)
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
        with self._cond:
            self._dead = True
            jobs = list(self._jobs.values())
        self._finish(jobs, error=error)
        if self.on_fatal is not None:
            self.on_fatal()

    def _unavailable(self) -> str:
        why = "the server is shutting down" if self._stopping else "the queue stopped"
        return f"{why}; retry against a running server"

    def _take_window(self) -> list[_Job] | None:
        budget = self.model.rule.token_budget
        with self._cond:
            while not self._queued_seqs and not self._stopping:
                self._cond.wait()
            if self._stopping:
                self._fail_waiting(running=False)
                return None
            if self._queued_tokens < budget and self.window_seconds > 0:
                # a short wait lets concurrent requests join a batch that is not full
                self._cond.wait(self.window_seconds)
            jobs: list[_Job] = []
            size, limit, last_due = 0, budget * WINDOW_BUDGETS, None
            while self._heap and (not jobs or size < limit):
                priority, _, job = heapq.heappop(self._heap)
                if not self._current(priority, job):
                    continue
                if last_due is None:
                    last_due = priority[0] + WINDOW_SPAN
                if jobs and (size + job.tokens > limit or priority[0] >= last_due):
                    heapq.heappush(self._heap, (priority, next(self._counter), job))
                    break
                job.running = True
                self._queued_seqs -= 1
                self._queued_tokens -= job.tokens
                size += job.tokens
                jobs.append(job)
            self._publish_depth()
            return jobs

    def _current(self, priority: tuple[float, int, int], job: _Job) -> bool:
        """Whether a heap entry still stands for a queued job (not dropped, taken, or
        pushed again with a better priority)."""
        return (
            not job.running
            and self._jobs.get(job.digest) is job
            and priority == job.priority
        )

    def _compute(self, window: list[_Job]) -> None:
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
        self._finish([job for job, done in zip(window, stored, strict=True) if done])
        todo = [job for job, done in zip(window, stored, strict=True) if not done]
        batches = plan_batches([job.tokens for job in todo], self.model.rule)
        for number, batch in enumerate(batches):
            if self.breaker.open:  # its queued work got 503 as it opened
                return
            jobs = self._still_wanted([todo[i] for i in batch])
            if jobs:
                self._forward_or_split(jobs)
            rest = [todo[i] for later in batches[number + 1 :] for i in later]
            if rest and self._hand_back(rest):
                return

    def _still_wanted(self, jobs: list[_Job]) -> list[_Job]:
        """The jobs someone still waits for; those whose requests all left are dropped
        before their forward pass."""
        with self._cond:
            gone = [job for job in jobs if not job.waiters]
            for job in gone:
                self._jobs.pop(job.digest, None)
        if gone:
            self.metrics.dropped.labels(self.model.name).inc(len(gone))
        return [job for job in jobs if job.waiters]

    def _hand_back(self, rest: list[_Job]) -> bool:
        """Return ``rest`` to the queue when a queued sequence is due before all of it
        (a small request behind a stream), or when the server is draining."""
        with self._cond:
            while self._heap and not self._current(self._heap[0][0], self._heap[0][2]):
                heapq.heappop(self._heap)
            due_first = min(job.priority for job in rest)
            earlier = bool(self._heap) and self._heap[0][0] < due_first
            if not (earlier or self._stopping):
                return False
            for job in rest:
                job.running = False
                self._queued_seqs += 1
                self._queued_tokens += job.tokens
                self._push(job)
            self._publish_depth()
            return True

    def _forward_or_split(self, jobs: list[_Job]) -> None:
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
                part = self._still_wanted(part)
                if part:
                    self._forward_or_split(part)
        else:
            self.breaker.passed()
            self._finish(jobs)

    def _backend_failed(self, jobs: list[_Job], err: Exception) -> None:
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
        with self._cond:
            waiting = list(self._jobs.values())
        self._finish(waiting, error=busy)

    def _fail(
        self, jobs: list[_Job], err: Exception, *, cause: Exception | None = None
    ) -> None:
        """Fail ``jobs`` (all of a pass or window) with the error their requests may
        see (a service error as decided, anything else a generic 500), logging its
        cause once with their request ids."""
        with self._cond:
            ids = sorted({t.request_id for job in jobs for t in job.waiters})
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
        self._finish(jobs, error=error)

    def _forward(self, jobs: list[_Job]) -> None:
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
        metrics.computed.labels(model.name).inc(result.n_computed)
        metrics.forward_seconds.labels(model.name).observe(seconds)
        padded = len(jobs) * max(tokens)
        metrics.batch_tokens.labels(model.name).observe(padded)
        with self._cond:
            self._clock += padded / model.rule.token_budget
        logger.debug(
            "%s: a batch of %d sequences, %.3f s", model.name, len(jobs), seconds
        )

    def _finish(self, jobs: list[_Job], *, error: Exception | None = None) -> None:
        """Answer the waiters of ``jobs``: done, or failed with ``error`` (and their
        other queued jobs dropped: nobody would read them)."""
        dropped = 0
        with self._cond:
            for job in jobs:
                if self._jobs.get(job.digest) is job:
                    self._forget(job)  # queued ones too (a breaker that opened)
                for ticket in list(job.waiters):
                    if ticket.future.done():
                        continue
                    if error is not None:
                        ticket.remaining.discard(job.digest)
                        dropped += self._release(ticket)
                        ticket.future.set_exception(error)
                        continue
                    ticket.remaining.discard(job.digest)
                    if not ticket.remaining:
                        ticket.future.set_result(None)
            self._publish_depth()
        if dropped:
            self.metrics.dropped.labels(self.model.name).inc(dropped)

    def _fail_waiting(self, *, running: bool) -> None:
        """503 to the requests of the queued jobs (and of the running ones too, when
        the thread has ended); the lock held."""
        error = ServiceUnavailableError(
            self._unavailable()
            if running
            else "the server is shutting down before this request's sequences "
            "were computed; retry against a running server"
        )
        for job in list(self._jobs.values()):
            if job.running and not running:
                continue
            for ticket in job.waiters:
                if not ticket.future.done():
                    ticket.future.set_exception(error)
            self._forget(job)
        self._heap.clear()
        self._publish_depth()


__all__ = ["Batcher", "Ticket"]
