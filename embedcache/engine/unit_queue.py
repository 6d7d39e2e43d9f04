"""Work units for a cluster, cut on demand and sized to a worker's measured rate."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from embedcache.engine.batching import batch_bounds
from embedcache.engine.plan import unit_of_batches

if TYPE_CHECKING:
    from collections.abc import Sequence

    from embedcache.engine.batching import BatchRule
    from embedcache.engine.plan import EmbedPlan, WorkUnit

# Unit size. A unit costs ~10-110 ms beyond its compute (the Dask round trip and one
# store commit per key; docs/design/dask-units.md, the high end on a saturated
# machine), so units are sized to about TARGET_UNIT_SECONDS of a worker's measured
# rate, and near the end of a job, to keep the tail short, down to half a worker's
# share of what is left but never below FLOOR_UNIT_SECONDS: overhead stays under 5%
# on CPUs and GPUs alike. The first units, before any rate is known, hold
# MIN_UNIT_TOKENS; MAX bounds what a killed worker's unit loses and what a unit holds.
TARGET_UNIT_SECONDS = 5.0
FLOOR_UNIT_SECONDS = 3.0
MIN_UNIT_TOKENS = 4_096
MAX_UNIT_TOKENS = 1_048_576


def next_unit_tokens(
    tokens_per_s: float | None, remaining_tokens: int, n_workers: int
) -> int:
    """Tokens for the next unit, from a worker's measured rate (None: not yet known).

    About :data:`TARGET_UNIT_SECONDS` of compute; less near the end of a job (half a
    worker's share of ``remaining_tokens``) but not under :data:`FLOOR_UNIT_SECONDS`;
    always within [:data:`MIN_UNIT_TOKENS`, :data:`MAX_UNIT_TOKENS`].
    """
    if tokens_per_s is None:
        size = float(MIN_UNIT_TOKENS)
    else:
        tail = remaining_tokens / (2 * max(1, n_workers))
        size = min(
            tokens_per_s * TARGET_UNIT_SECONDS,
            max(tokens_per_s * FLOOR_UNIT_SECONDS, tail),
        )
    return int(min(MAX_UNIT_TOKENS, max(MIN_UNIT_TOKENS, size)))


class UnitQueue:
    """Work units handed out on demand, the longest sequences first.

    :meth:`from_plan` cuts the plan's length-sorted batches (those of the in-process
    engine) into units as they are asked for, each of a given number of tokens or
    sized by :func:`next_unit_tokens`; :meth:`from_units` hands out ready units.
    """

    def __init__(
        self,
        plan: EmbedPlan | None,
        batches: tuple[np.ndarray, np.ndarray],
        units: list[WorkUnit],
        unit_tokens: int | None,
    ) -> None:
        self._plan = plan
        # (order, bounds) of batch_bounds: ascending length, taken from the end
        self._order, self._bounds = batches
        self._top = len(self._bounds) - 1  # batches not yet handed out
        self._units = units
        self._unit_tokens = unit_tokens
        self._issued = 0
        self.n_seqs = plan.n_computed if plan else sum(u.n_seqs for u in units)
        self.remaining_tokens = (
            int(plan.missing_tokens.sum()) if plan else sum(u.n_tokens for u in units)
        )

    @classmethod
    def from_plan(
        cls,
        plan: EmbedPlan,
        *,
        rule: BatchRule,
        unit_tokens: int | None = None,
    ) -> UnitQueue:
        if unit_tokens is not None and unit_tokens < 1:
            msg = f"unit size must be a positive number of tokens, got {unit_tokens}"
            raise ValueError(msg)
        return cls(plan, batch_bounds(plan.missing_tokens, rule), [], unit_tokens)

    @classmethod
    def from_units(cls, units: Sequence[WorkUnit]) -> UnitQueue:
        ordered = sorted(units, key=lambda u: max(u.tokens, default=0))
        none = (np.empty(0, np.int64), np.zeros(1, np.int64))
        return cls(None, none, ordered, None)

    def __bool__(self) -> bool:
        return bool(self._top > 0 or self._units)

    def next_unit(self, *, tokens_per_s: float | None, n_workers: int) -> WorkUnit:
        """The next unit (the queue must not be empty)."""
        if self._units:
            unit = self._units.pop()
        else:
            assert self._plan is not None
            size = self._unit_tokens or next_unit_tokens(
                tokens_per_s, self.remaining_tokens, n_workers
            )
            taken: list[np.ndarray] = []
            n_tokens = 0
            while self._top > 0 and n_tokens < size:
                self._top -= 1
                lo, hi = self._bounds[self._top], self._bounds[self._top + 1]
                batch = self._order[lo:hi]
                taken.append(batch)
                n_tokens += int(self._plan.missing_tokens[batch].sum())
            unit = unit_of_batches(self._plan, taken, index=self._issued)
        self._issued += 1
        self.remaining_tokens -= unit.n_tokens
        return unit


__all__ = [
    "FLOOR_UNIT_SECONDS",
    "MAX_UNIT_TOKENS",
    "MIN_UNIT_TOKENS",
    "TARGET_UNIT_SECONDS",
    "UnitQueue",
    "next_unit_tokens",
]
