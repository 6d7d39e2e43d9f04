"""The token budget a model's batches are cut to, chosen on the machine that runs them.

An adapter names the budget measured on this project's CPUs
(``preferred_token_budget``). Where matmuls are cheap (AMX, GPUs) larger batches may
win; where caches are small, smaller ones. :func:`tuned_batch_rule` hands the
choice to the kernel tuner (:mod:`embedcache.models.shared.tuning`) as the problem
``budget``: candidates the adapter's budget (the reference), half of it and twice
it, each timed embedding the same synthetic sequences. Vectors do not depend on the
budget (docs/reproducibility.md), so the candidates agree to the bit; the tuner's
check would drop one that did not.

Only adapters that say what they compute (``tuning_shape``: family and network size,
not the weights) are tuned; the floors count, and their budget only groups commits.
The choice is timed once per machine, model shape and dtype, then cached: a few
forward passes of twice the budget each (about a second for the test models, 6-42 s
for HyenaDNA medium, Caduceus-ph and a 512x8 BERT on two cores: docs/kernels.md).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from embedcache.engine.batching import BatchRule, batch_rule, plan_batches
from embedcache.engine.synthetic import fitting_sequence
from embedcache.errors import EmbedcacheError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from embedcache.models.base import Adapter
    from embedcache.models.shared.tuning import Tuner

logger = logging.getLogger(__name__)

# the synthetic sequences' length: the leaderboard's longest (human_enhancers_cohn)
TUNING_BASES = 500


def tuned_batch_rule(
    adapter: Adapter, token_budget: int | None = None, *, tuner: Tuner | None = None
) -> BatchRule:
    """:func:`batch_rule` with the budget given, else the tuner's choice for this
    machine (the adapter's own where it is not tuned, or ``EMBEDCACHE_TUNE=off``)."""
    if token_budget is None and getattr(adapter, "tuning_shape", None) is not None:
        token_budget = choose_token_budget(adapter, tuner=tuner)
    return batch_rule(adapter, token_budget)


def budget_candidates(preferred: int) -> tuple[int, ...]:
    """The adapter's budget first (the reference), then half and twice it."""
    return tuple(dict.fromkeys((preferred, max(preferred // 2, 1), preferred * 2)))


def synthetic_sequences(adapter: Adapter, n_seqs: int) -> list[str]:
    """``n_seqs`` random sequences of :data:`TUNING_BASES` bases, each halved until
    the model's context holds it."""
    return [fitting_sequence(adapter, TUNING_BASES, seed=i) for i in range(n_seqs)]


def choose_token_budget(adapter: Adapter, *, tuner: Tuner | None = None) -> int:
    """The fastest of :func:`budget_candidates` for ``adapter`` on this machine."""
    from embedcache.models.shared.tuning import (
        Candidate,
        Problem,
        TuningError,
        length_bucket,
        process_tuner,
    )

    tuner = tuner or process_tuner()
    own = batch_rule(adapter)
    preferred = own.token_budget
    budgets = budget_candidates(preferred)
    probe = synthetic_sequences(adapter, 8)
    padded = max(own.padded(adapter.n_tokens(seq)) for seq in probe)
    # every candidate embeds the same sequences: one full batch of the largest
    n_seqs = max(1, -(-max(budgets) // padded))

    def runner(budget: int) -> Candidate:
        rule = batch_rule(adapter, budget)

        def run(seqs: Sequence[str]) -> np.ndarray:
            out = np.empty((len(seqs), adapter.dim), dtype=np.float32)
            for batch in plan_batches([adapter.n_tokens(s) for s in seqs], rule):
                out[batch] = adapter.embed_batch([seqs[i] for i in batch])
            return out

        return Candidate(str(budget), run)

    problem = Problem(
        "budget", adapter.key.dtype, length_bucket(padded), adapter.tuning_shape
    )
    if tuner.will_time(problem, [str(b) for b in budgets]):
        logger.info(
            "token budget %s: choosing among %s on this machine (once; "
            "--token-budget or EMBEDCACHE_TUNE=budget=N skips it)",
            problem.key(),
            ", ".join(map(str, budgets)),
        )
    try:
        name = tuner.choose(
            problem,
            [runner(b) for b in budgets],
            lambda: synthetic_sequences(adapter, n_seqs),
            repeats=1,
        )
    except EmbedcacheError as err:
        if isinstance(err, TuningError):  # the user's override: theirs to fix
            raise
        # the model refused the synthetic input: its own budget, not a failed run
        logger.warning("token budget %s: not tuned (%s)", problem.key(), err)
        return preferred
    return int(name)


__all__ = [
    "TUNING_BASES",
    "budget_candidates",
    "choose_token_budget",
    "synthetic_sequences",
    "tuned_batch_rule",
]
