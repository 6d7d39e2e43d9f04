"""The in-process path: plan, batch, forward and commit one batch at a time here."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from tqdm.auto import tqdm

from embedcache.engine.budget import tuned_batch_rule
from embedcache.engine.forward import collect_result, run_unit
from embedcache.engine.plan import iter_units, plan_embedding

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from embedcache.engine.plan import EmbedResult, WorkUnit
    from embedcache.models.base import Adapter
    from embedcache.store import EmbeddingStore

logger = logging.getLogger(__name__)


def embed_sequences(
    adapter: Adapter,
    seqs: Sequence[str],
    store: EmbeddingStore,
    *,
    names: Sequence[str] | None = None,
    token_budget: int | None = None,
    progress: bool = False,
) -> EmbedResult:
    """Return one vector per sequence, computing and storing only what the store lacks.

    Every sequence is validated and length-checked before anything is computed, so a
    bad item leaves the store unchanged. Missing vectors are computed in length-sorted
    batches and committed to the store batch by batch: an interrupted run loses at
    most one batch and a rerun picks up the rest.

    Memory: beside the caller's ``seqs`` and the result, the run holds ~50 bytes per
    sequence (the plan) and one batch or one :data:`~embedcache.engine.plan.LOOKUP_CHUNK`
    of rows at a time; no Python object per sequence lives for the whole run.

    Parameters
    ----------
    names
        Item names for error messages (e.g. ``"line 3"`` or an item id), one per sequence.
    token_budget
        Upper bound on padded tokens (longest item x batch size) per forward pass;
        None takes the tuner's choice for this machine around the adapter's
        ``preferred_token_budget`` (see :func:`.budget.tuned_batch_rule`).

    Raises
    ------
    InvalidSequenceError, SequenceTooLongError
        From :func:`~embedcache.engine.plan.plan_embedding`, before anything is
        computed.
    """
    plan = plan_embedding(adapter, seqs, store, names=names, progress=progress)
    if plan.n_computed:
        # chosen only when there is work: a first choice on a machine is timed
        rule = tuned_batch_rule(adapter, token_budget)
        # one batch a unit, cut as it is run: each batch is committed as soon as it
        # is computed, and only its sequences are held
        units = iter_units(plan, rule=rule, unit_tokens=1)
        _run_units(adapter, store, units, n_seqs=plan.n_computed, progress=progress)
    return collect_result(
        store,
        plan,
        key=adapter.key,
        dim=adapter.dim,
        alias=getattr(adapter, "alias", None),
        progress=progress,
    )


def _run_units(
    adapter: Adapter,
    store: EmbeddingStore,
    units: Iterable[WorkUnit],
    *,
    n_seqs: int,
    progress: bool,
) -> None:
    total_tokens = 0
    start = time.perf_counter()
    with tqdm(
        total=n_seqs,
        desc=f"embed {adapter.key.model_id}",
        unit="seq",
        disable=not progress,
    ) as bar:
        for number, unit in enumerate(units, start=1):
            result = run_unit(adapter, store, unit)
            total_tokens += result.n_tokens
            elapsed = max(time.perf_counter() - start, 1e-9)
            bar.update(unit.n_seqs)
            bar.set_postfix_str(f"{total_tokens / elapsed:,.0f} tok/s", refresh=False)
            logger.debug("stored batch %d (%d sequences)", number, unit.n_seqs)
    elapsed = time.perf_counter() - start
    logger.info(
        "computed %d sequences (%d tokens) in %.1f s: %.1f seq/s, %.0f tokens/s",
        n_seqs,
        total_tokens,
        elapsed,
        n_seqs / max(elapsed, 1e-9),
        total_tokens / max(elapsed, 1e-9),
    )


__all__ = ["embed_sequences"]
