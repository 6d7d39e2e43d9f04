"""The model's health: a canary batch, a warm-up at the largest batch, and a circuit
breaker over consecutive failed batches.

A pass that fails is the input's fault only if a known-good canary batch passes on
the same model; if the canary fails too, the backend failed (a device fault). After
``failures`` such passes in a row the breaker opens: the replica is not ready, and
its batcher runs the canary every ``probe_seconds`` until it passes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from embedcache.engine.forward import embed_outputs, inference_mode
from embedcache.engine.synthetic import fitting_sequence
from embedcache.errors import InvalidVectorError

if TYPE_CHECKING:
    from embedcache.engine.batching import BatchRule
    from embedcache.models.base import Adapter

CANARY_BASES = 48
CANARY_SIZE = 2
# the warm-up's sequences, when the model has no context limit of its own
WARM_UP_BASES = 1024
WARM_UP_MAX_SEQS = 4096


def canary_batch(adapter: Adapter) -> list[str]:
    """A small batch any healthy model embeds: short random ACGT sequences."""
    return [fitting_sequence(adapter, CANARY_BASES, seed=i) for i in range(CANARY_SIZE)]


def warm_up_batch(adapter: Adapter, rule: BatchRule) -> list[str]:
    """The largest batch the batcher may run: sequences as long as the context (or
    :data:`WARM_UP_BASES`), as many as the rule lets share a pass."""
    seq = fitting_sequence(adapter, WARM_UP_BASES, seed=0)
    tokens = adapter.n_tokens(seq)
    count = max(1, min(WARM_UP_MAX_SEQS, rule.token_budget // max(tokens, 1)))
    while count > 1 and not rule.fits(count, tokens):
        count -= 1
    return [seq] * count


def forward_checked(adapter: Adapter, seqs: list[str]) -> None:
    """One forward pass of ``seqs``, not stored.

    Raises
    ------
    InvalidVectorError
        A vector is not finite.
    Exception
        Whatever the forward raises.
    """
    with inference_mode():
        outputs = embed_outputs(adapter, seqs)
    if not np.isfinite(outputs).all():
        msg = f"{adapter.key.short()} gave non-finite vectors for a known-good batch"
        raise InvalidVectorError(msg)


@dataclass(frozen=True)
class HealthPolicy:
    """When a model turns not ready (``failures`` passes in a row failing with their
    canary), how often its canary then runs, and how long one step of its thread may
    take before liveness fails."""

    failures: int = 3
    probe_seconds: float = 5.0
    stall_seconds: float = 600.0


class Breaker:
    """Consecutive failed batches of one model; :attr:`open` past ``failures``."""

    def __init__(self, *, failures: int, probe_seconds: float) -> None:
        self.failures = failures
        self.probe_seconds = probe_seconds
        self.n_failed = 0  # passes in a row whose canary failed too
        self.opened_at: float | None = None

    @property
    def open(self) -> bool:
        return self.opened_at is not None

    def passed(self) -> None:
        """A pass or canary went through: the model works."""
        self.n_failed = 0
        self.opened_at = None

    def failed(self) -> bool:
        """A pass failed with its canary; whether the breaker opened just now."""
        self.n_failed += 1
        if self.open or self.n_failed < self.failures:
            return False
        self.opened_at = time.monotonic()
        return True


__all__ = [
    "Breaker",
    "HealthPolicy",
    "canary_batch",
    "forward_checked",
    "warm_up_batch",
]
