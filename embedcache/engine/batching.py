"""Batch: which sequences share a forward pass (sorted by length, within budgets).

The one batching rule of `embed`, the cluster and the server. An adapter that pads
each sequence to the bucket of its own length (``pads_to_buckets``, see
:mod:`embedcache.models.shared.padding`) gets batches of one bucket each, counted at
the bucket's length: its vectors are then the same whatever the batch.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from embedcache.models.base import DEFAULT_TOKEN_BUDGET
from embedcache.models.shared.padding import padded_length

if TYPE_CHECKING:
    from collections.abc import Sequence

    from embedcache.models.base import Adapter

# Attention score elements (sequences x score maps x longest^2) per forward pass and
# layer: 2^27 is 256 MiB in bf16. Scores grow with the square of the length while the
# rest of a forward pass grows linearly, so long sequences batch fewer at a time (one
# sequence always runs, however long).
ATTENTION_SCORE_BUDGET = 2**27


@dataclass(frozen=True)
class BatchRule:
    """Which sequences share a forward pass.

    A batch of ``count`` sequences whose longest has ``longest`` tokens fits when its
    padded tokens (``count * longest``) stay within ``token_budget`` and its attention
    scores (``count * attention_maps * longest**2``) within ``score_budget``; with
    ``equal_lengths`` only sequences of one token count go together; with
    ``buckets`` only sequences of one length bucket, and ``longest`` is counted at
    its bucket's length (:func:`~embedcache.models.shared.padding.padded_length`).
    """

    token_budget: int
    equal_lengths: bool = False
    attention_maps: int = 0  # score matrices a sequence adds; 0: no attention
    score_budget: int = ATTENTION_SCORE_BUDGET
    buckets: bool = False

    def __post_init__(self) -> None:
        if self.token_budget < 1:
            msg = f"token budget must be positive, got {self.token_budget}"
            raise ValueError(msg)

    def fits(self, count: int, longest: int) -> bool:
        """Whether ``count`` sequences of at most ``longest`` tokens make one batch."""
        longest = self.padded(longest)
        if count * longest > self.token_budget:
            return False
        scores = count * self.attention_maps * longest * longest
        return scores <= self.score_budget

    def padded(self, n_tokens: int) -> int:
        """The length a sequence of ``n_tokens`` runs at: its bucket's, or its own."""
        return padded_length(n_tokens) if self.buckets else n_tokens

    def apart(self, first: int, length: int) -> bool:
        """Whether sequences of ``first`` and ``length`` tokens must not share a batch."""
        return (self.equal_lengths or self.buckets) and self.padded(
            first
        ) != self.padded(length)


def batch_rule(adapter: Adapter, token_budget: int | None = None) -> BatchRule:
    """The adapter's batching: the given token budget, else its preferred one, else the
    default; its attention score maps per sequence; equal lengths if it needs them;
    length buckets if it pads to them."""
    if token_budget is None:
        token_budget = getattr(adapter, "preferred_token_budget", DEFAULT_TOKEN_BUDGET)
    return BatchRule(
        token_budget=int(token_budget),
        equal_lengths=bool(adapter.needs_equal_lengths),
        attention_maps=int(getattr(adapter, "attention_maps", 0)),
        buckets=bool(getattr(adapter, "pads_to_buckets", False)),
    )


def batch_bounds(
    n_tokens: Sequence[int] | np.ndarray, rule: BatchRule
) -> tuple[np.ndarray, np.ndarray]:
    """Batches by length as two arrays: ``order`` (indices sorted by token count, ties
    by index) and ``bounds``; batch ``b`` is ``order[bounds[b]:bounds[b + 1]]``.

    Each batch is as large as ``rule`` allows (at least one item). Two int64 arrays
    instead of a list per batch: a million sequences cost 16 MB, not ~40 MB of ints.
    """
    tokens = np.asarray(n_tokens, dtype=np.int64)
    order = np.argsort(tokens, kind="stable")
    starts = [0] if len(order) else []
    count = first = 0
    for pos, length in enumerate(tokens[order].tolist()):
        # sorted ascending: this item is the longest in the batch so far
        if count and (not rule.fits(count + 1, length) or rule.apart(first, length)):
            starts.append(pos)
            count = 0
        if not count:
            first = length
        count += 1
    starts.append(len(order))
    return order, np.asarray(starts, dtype=np.int64)


def plan_batches(n_tokens: Sequence[int], rule: BatchRule) -> list[list[int]]:
    """Group indices into batches by length (:func:`batch_bounds` as lists)."""
    order, bounds = batch_bounds(n_tokens, rule)
    return [order[a:b].tolist() for a, b in itertools.pairwise(bounds.tolist())]


__all__ = [
    "ATTENTION_SCORE_BUDGET",
    "DEFAULT_TOKEN_BUDGET",
    "BatchRule",
    "batch_bounds",
    "batch_rule",
    "plan_batches",
]
