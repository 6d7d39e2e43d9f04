"""What a request does before and after the queue: validate, hash and look up its
sequences (the engine's plan), then read its vectors back from the store.

The store is reached through the :class:`~embedcache.service.faults.StoreBoundary`:
what it raises is a store fault (503, or 500 ``store_corrupt``), never the input's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from embedcache.engine.forward import gather_vectors
from embedcache.engine.plan import plan_embedding
from embedcache.errors import InvalidSequenceError, SequenceTooLongError
from embedcache.service.errors import UnprocessableSequenceError
from embedcache.service.faults import guarded

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np

    from embedcache.engine.plan import EmbedPlan
    from embedcache.service.registry import ServedModel
    from embedcache.store import EmbeddingStore

# plan_embedding names items as given; "field[i]" lets the error carry the index
_NAMED_INDEX = re.compile(r"^\w+\[(\d+)\]")


@dataclass(frozen=True)
class RequestPlan:
    """A request's plan and, per input row, whether the store held it on arrival;
    its vectors when every row was held (read in the same call)."""

    plan: EmbedPlan
    cached: list[bool]
    vectors: np.ndarray | None = None


def plan_request(
    model: ServedModel, seqs: Sequence[str], store: EmbeddingStore, *, field: str
) -> RequestPlan:
    """Validate, hash and length-check ``seqs`` and look them up, as `embed` does;
    if the store holds every one, read their vectors too.

    Raises
    ------
    UnprocessableSequenceError
        A sequence holds a character other than A/C/G/T/N, is empty, or is longer
        than the model's context (unless it truncates); ``index`` names it.
    StoreFaultError, StoreCorruptError
        The store failed (whatever it raised).
    """
    store = guarded(store)
    names = [f"{field}[{i}]" for i in range(len(seqs))]
    try:
        plan = plan_embedding(model.adapter, seqs, store, names=names)
    except (InvalidSequenceError, SequenceTooLongError) as err:
        found = _NAMED_INDEX.match(str(err))
        index = int(found.group(1)) if found else None
        raise UnprocessableSequenceError(str(err), index=index) from err
    missing = set(plan.missing_hashes)
    cached = [digest not in missing for digest in plan.hashes]
    # hits only: read now, in this thread; a hand-back to the loop and a second
    # worker thread would each be a wait for the GIL while the server computes
    vectors = read_vectors(model, store, plan) if not plan.n_computed else None
    return RequestPlan(plan, cached, vectors)


def read_vectors(
    model: ServedModel, store: EmbeddingStore, plan: EmbedPlan
) -> np.ndarray:
    """The request's vectors from the store, float32, one row per input."""
    return gather_vectors(guarded(store), plan, model.key, model.dim, refresh=False)


__all__ = ["RequestPlan", "plan_request", "read_vectors"]
