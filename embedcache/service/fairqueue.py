"""The queue of one served model: jobs in fair-queueing order, and their waiters.

Requests enqueue the distinct sequences the store lacks; the same sequence asked for
by several requests in flight is one job with several waiters, so it is computed
once. The model's :class:`~embedcache.service.batcher.Batcher` takes a window of
the queued sequences in tag order (below), at most :data:`WINDOW_BUDGETS` token
budgets, and answers the waiters pass by pass.

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
from embedcache.service.errors import (
    QueueFullError,
    RequestTooLargeError,
    ServiceUnavailableError,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from embedcache.engine.batching import BatchRule
    from embedcache.service.metrics import Metrics

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
class Job:
    """One distinct sequence to compute, and the requests waiting for it."""

    digest: str
    seq: str
    tokens: int
    priority: tuple[float, int, int]  # (tag, request, position)
    waiters: set[Ticket] = field(default_factory=set)
    running: bool = False
    queued_at: float = field(default_factory=time.perf_counter)  # the queue stage


class FairQueue:
    """The jobs of one served model, in tag order; every method takes the lock."""

    def __init__(
        self,
        name: str,
        rule: BatchRule,
        *,
        metrics: Metrics,
        max_queue_tokens: int,
        window_seconds: float,
        refusal: Callable[[], Exception | None] = lambda: None,
    ) -> None:
        self.name = name
        self.refusal = refusal  # an error refusing new work, or None
        self.rule = rule
        self.metrics = metrics
        self.max_queue_tokens = max_queue_tokens
        self.window_seconds = window_seconds
        self._cond = threading.Condition()
        self._jobs: dict[str, Job] = {}
        self._heap: list[tuple[tuple[float, int, int], int, Job]] = []
        self._counter = itertools.count()
        self._tickets = itertools.count()
        self._queued_seqs = 0
        self._queued_tokens = 0
        self._stopping = False
        self._dead = False  # the thread ended (a drain, or a fault outside the guard)
        self._clock = 0.0  # token budgets of work computed so far

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
        budget = self.rule.token_budget
        due = np.empty(len(digests), dtype=np.float64)
        work = 0
        for batch in plan_batches(tokens, self.rule):
            work += len(batch) * max(tokens[i] for i in batch)
            due[batch] = work / budget
        with self._cond:
            if self._stopping or self._dead:
                raise ServiceUnavailableError(self._unavailable())
            refused = self.refusal()
            if refused is not None:
                raise refused
            new = [i for i, d in enumerate(digests) if d not in self._jobs]
            new_tokens = sum(tokens[i] for i in new)
            if new_tokens > self.max_queue_tokens:
                msg = (
                    f"the request needs {new_tokens} tokens computed, more than the "
                    f"queue limit of {self.max_queue_tokens} tokens of {self.name!r}; "
                    "split it into smaller requests"
                )
                raise RequestTooLargeError(msg)
            if new and self._queued_tokens + new_tokens > self.max_queue_tokens:
                msg = (
                    f"the queue of {self.name!r} holds {self._queued_tokens} tokens "
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
                    job = Job(digest, seqs[i], tokens[i], priority)
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
            self.metrics.dropped.labels(self.name).inc(dropped)
            logger.info(
                "%s: dropped %d queued sequences of a gone client",
                self.name,
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
    def depth(self) -> tuple[int, int]:
        """Queued (not yet running) sequences and their tokens."""
        with self._cond:
            return self._queued_seqs, self._queued_tokens

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def dead(self) -> bool:
        """The thread ended: no more work is taken."""
        return self._dead

    def stop(self) -> None:
        """Take no more work; wake the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def wait_stop(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for a stop; on one, 503 to the queued requests."""
        with self._cond:
            self._cond.wait_for(lambda: self._stopping, seconds)
            if self._stopping:
                self._fail_waiting(running=False)
            return self._stopping

    def close(self) -> None:
        """The thread ended: every waiting request gets 503, and new ones too."""
        with self._cond:
            self._dead = True
            self._fail_waiting(running=True)

    def refuse(self) -> None:
        """Take no more work (the thread is ending) without failing the waiting."""
        with self._cond:
            self._dead = True

    def pending(self) -> list[Job]:
        """Every job queued or running."""
        with self._cond:
            return list(self._jobs.values())

    def unanswered(self, window: list[Job]) -> list[Job]:
        """The running jobs of ``window`` not yet answered nor handed back."""
        with self._cond:
            return [j for j in window if self._jobs.get(j.digest) is j and j.running]

    def request_ids(self, jobs: list[Job]) -> list[str]:
        with self._cond:
            return sorted({t.request_id for job in jobs for t in job.waiters})

    def advance(self, padded_tokens: int) -> None:
        """Move the work clock on by a pass's padded tokens."""
        with self._cond:
            self._clock += padded_tokens / self.rule.token_budget

    def _push(self, job: Job) -> None:
        heapq.heappush(self._heap, (job.priority, next(self._counter), job))

    def _forget(self, job: Job) -> None:
        del self._jobs[job.digest]
        if not job.running:
            self._queued_seqs -= 1
            self._queued_tokens -= job.tokens

    def _publish_depth(self) -> None:
        self.metrics.queue_seqs.labels(self.name).set(self._queued_seqs)
        self.metrics.queue_tokens.labels(self.name).set(self._queued_tokens)

    def _unavailable(self) -> str:
        why = "the server is shutting down" if self._stopping else "the queue stopped"
        return f"{why}; retry against a running server"

    def take_window(self) -> list[Job] | None:
        budget = self.rule.token_budget
        with self._cond:
            while not self._queued_seqs and not self._stopping:
                self._cond.wait()
            if self._stopping:
                self._fail_waiting(running=False)
                return None
            if self._queued_tokens < budget and self.window_seconds > 0:
                # a short wait lets concurrent requests join a batch that is not full
                self._cond.wait(self.window_seconds)
            jobs: list[Job] = []
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
                self.metrics.observe_stage(
                    self.name, "queue", time.perf_counter() - job.queued_at
                )
                self._queued_seqs -= 1
                self._queued_tokens -= job.tokens
                size += job.tokens
                jobs.append(job)
            self._publish_depth()
            return jobs

    def _current(self, priority: tuple[float, int, int], job: Job) -> bool:
        """Whether a heap entry still stands for a queued job (not dropped, taken, or
        pushed again with a better priority)."""
        return (
            not job.running
            and self._jobs.get(job.digest) is job
            and priority == job.priority
        )

    def still_wanted(self, jobs: list[Job]) -> list[Job]:
        """The jobs someone still waits for; those whose requests all left are dropped
        before their forward pass."""
        with self._cond:
            gone = [job for job in jobs if not job.waiters]
            for job in gone:
                self._jobs.pop(job.digest, None)
        if gone:
            self.metrics.dropped.labels(self.name).inc(len(gone))
        return [job for job in jobs if job.waiters]

    def hand_back(self, rest: list[Job]) -> bool:
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

    def finish(self, jobs: list[Job], *, error: Exception | None = None) -> None:
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
            self.metrics.dropped.labels(self.name).inc(dropped)

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


__all__ = ["WINDOW_BUDGETS", "FairQueue", "Job", "Ticket"]
