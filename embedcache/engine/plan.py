"""Plan: what one embedding call has to do, decided before anything is computed.

Validate, hash and length-check every sequence, look the distinct ones up in the
store, and cut the missing ones into work units of whole batches. The records here
(:class:`EmbedPlan`, :class:`WorkUnit`, :class:`UnitResult`, :class:`EmbedResult`)
are plain data that both execution paths pass along.

Counting convention of :class:`EmbedResult`: ``n_computed`` is the number of distinct
sequences run through the model in this call; every other input row is ``n_cached``,
including repeats of a sequence computed earlier in the same call. So
``n_computed + n_cached == len(seqs)`` and a second identical call reports
``n_computed == 0``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from tqdm.auto import tqdm

from embedcache.data.seqfile import validate_sequence
from embedcache.engine.batching import plan_batches
from embedcache.errors import SequenceTooLongError
from embedcache.hashing import sequence_key

if TYPE_CHECKING:
    from collections.abc import Sequence

    from embedcache.engine.batching import BatchRule
    from embedcache.models.base import Adapter
    from embedcache.specs import ModelKey
    from embedcache.store import EmbeddingStore

logger = logging.getLogger(__name__)

# hashes per store look-up call: a progress step, and a bounded temporary array
LOOKUP_CHUNK = 100_000


@dataclass(frozen=True)
class EmbedResult:
    """Vectors in input order (float32, (n, dim)) and what was computed vs found.

    ``keys`` are the keys the call filled, the vectors' first (one per layer of a
    layer sweep).
    """

    vectors: np.ndarray
    n_computed: int
    n_cached: int
    keys: tuple[ModelKey, ...] = ()


@dataclass(frozen=True)
class EmbedPlan:
    """What one embedding call has to do, decided before anything is computed.

    ``hashes`` has one entry per input row; the ``missing_*`` lists describe the
    distinct sequences that at least one of ``keys`` lacks, in first-occurrence order.
    """

    keys: tuple[ModelKey, ...]
    hashes: list[str]
    unique: list[str]
    missing_seqs: list[str]
    missing_hashes: list[str]
    missing_tokens: list[int]

    @property
    def n_computed(self) -> int:
        return len(self.missing_hashes)

    @property
    def n_cached(self) -> int:
        return len(self.hashes) - len(self.missing_hashes)


@dataclass(frozen=True, slots=True)
class WorkUnit:
    """Consecutive length-sorted batches that are embedded and committed together.

    Plain data (picklable): a Dask task receives it whole. ``batches`` holds positions
    into ``seqs``, one forward pass each.
    """

    index: int
    seqs: tuple[str, ...]
    hashes: tuple[str, ...]
    tokens: tuple[int, ...]  # the model's token count of each sequence
    batches: tuple[tuple[int, ...], ...]

    @property
    def n_seqs(self) -> int:
        return len(self.seqs)

    @property
    def n_tokens(self) -> int:
        return sum(self.tokens)


@dataclass(frozen=True, slots=True)
class UnitResult:
    """Counts of one executed unit (a Dask task returns this, never vectors)."""

    index: int
    n_seqs: int  # sequences in the unit
    n_computed: int  # sequences run through the model by this execution
    n_tokens: int  # tokens of the sequences run through the model
    seconds: float


def adapter_keys(adapter: Adapter) -> tuple[ModelKey, ...]:
    """Every key one forward pass of ``adapter`` fills (several in a layer sweep)."""
    return tuple(getattr(adapter, "keys", None) or (adapter.key,))


def plan_embedding(
    adapter: Adapter,
    seqs: Sequence[str],
    store: EmbeddingStore,
    *,
    names: Sequence[str] | None = None,
    progress: bool = False,
) -> EmbedPlan:
    """Validate and hash every sequence, look up the store, length-check the missing.

    Only the missing sequences are tokenised: a stored vector was computed under
    this very key, so its sequence passed the same length rule (a run answered
    from the store tokenises nothing).

    With ``progress``, the hashing and the store look-up show progress bars (on a
    million short sequences each takes seconds before any batch runs).

    Raises
    ------
    InvalidSequenceError
        A sequence is empty or holds a character other than A/C/G/T/N.
    SequenceTooLongError
        A sequence exceeds the model's maximum and the key names no truncation policy.
    """
    n = len(seqs)
    if names is not None and len(names) != n:
        msg = f"{len(names)} names were given for {n} sequences"
        raise ValueError(msg)
    # one computation per distinct sequence; remember where it first occurs for
    # messages. Only the distinct sequences are kept (a million inputs: memory).
    hashes: list[str] = []
    first_index: dict[str, int] = {}
    unique_seqs: list[str] = []
    for i, seq in enumerate(
        tqdm(seqs, desc="hash", unit="seq", disable=not progress, mininterval=0.5)
    ):
        clean = validate_sequence(seq, _item_name(names, i))
        digest = sequence_key(clean)
        hashes.append(digest)
        if digest not in first_index:
            first_index[digest] = i
            unique_seqs.append(clean)
    unique = list(first_index)

    # a sequence is computed when any of the adapter's keys (layers) lacks it
    keys = adapter_keys(adapter)
    found = np.ones(len(unique), dtype=bool)
    with tqdm(
        total=len(unique) * len(keys),
        desc="look up",
        unit="seq",
        disable=not progress,
        mininterval=0.5,
    ) as bar:
        for output_key in keys:
            for lo in range(0, len(unique), LOOKUP_CHUNK):
                part = unique[lo : lo + LOOKUP_CHUNK]
                found[lo : lo + len(part)] &= np.asarray(
                    store.contains(output_key, part), dtype=bool
                )
                bar.update(len(part))
    missing = np.flatnonzero(~found).tolist()
    missing_seqs = [unique_seqs[i] for i in missing]
    n_tokens = _count_tokens(adapter, missing_seqs)
    first = list(first_index.values())
    _check_lengths(adapter, n_tokens, [first[i] for i in missing], missing_seqs, names)
    logger.info(
        "%s: %d sequences, %d distinct, %d to compute",
        adapter.key.short(),
        n,
        len(unique),
        len(missing),
    )
    return EmbedPlan(
        keys=keys,
        hashes=hashes,
        unique=unique,
        missing_seqs=missing_seqs,
        missing_hashes=[unique[i] for i in missing],
        missing_tokens=n_tokens,
    )


def cut_units(
    plan: EmbedPlan,
    *,
    rule: BatchRule,
    unit_tokens: int,
) -> list[WorkUnit]:
    """Cut a plan's missing sequences into work units of about ``unit_tokens`` tokens.

    The batches are exactly those of :func:`plan_batches` over all missing sequences
    (so vectors do not depend on how they are grouped into units); consecutive
    batches join a unit until it holds ``unit_tokens`` sequence tokens. With
    ``unit_tokens`` of 1 every batch is its own unit.
    """
    if unit_tokens < 1:
        msg = f"unit size must be a positive number of tokens, got {unit_tokens}"
        raise ValueError(msg)
    tokens = plan.missing_tokens
    batches = plan_batches(tokens, rule)
    units: list[WorkUnit] = []
    current: list[list[int]] = []
    size = 0
    for batch in batches:
        current.append(batch)
        size += sum(tokens[i] for i in batch)
        if size >= unit_tokens:
            units.append(unit_of_batches(plan, current, index=len(units)))
            current, size = [], 0
    if current:
        units.append(unit_of_batches(plan, current, index=len(units)))
    return units


def unit_of_batches(
    plan: EmbedPlan, batches: Sequence[Sequence[int]], *, index: int
) -> WorkUnit:
    """The work unit of ``batches`` (positions into the plan's missing sequences)."""
    rows = [i for batch in batches for i in batch]
    where = {row: pos for pos, row in enumerate(rows)}
    return WorkUnit(
        index=index,
        seqs=tuple(plan.missing_seqs[i] for i in rows),
        hashes=tuple(plan.missing_hashes[i] for i in rows),
        tokens=tuple(plan.missing_tokens[i] for i in rows),
        batches=tuple(tuple(where[i] for i in batch) for batch in batches),
    )


def _item_name(names: Sequence[str] | None, index: int) -> str:
    return names[index] if names is not None else f"sequence #{index} (0-based)"


def _count_tokens(adapter: Adapter, seqs: Sequence[str]) -> list[int]:
    many = getattr(adapter, "n_tokens_many", None)
    if many is not None:
        return list(many(seqs))
    return [adapter.n_tokens(seq) for seq in seqs]


def _check_lengths(
    adapter: Adapter,
    n_tokens: Sequence[int],
    positions: Sequence[int],
    seqs: Sequence[str],
    names: Sequence[str] | None,
) -> None:
    """Raise for the first too-long sequence; ``n_tokens``, ``positions`` (input
    indices) and ``seqs`` describe the distinct sequences to compute, aligned."""
    limit = adapter.max_tokens
    if limit is None or adapter.key.truncation != "error":
        return
    too_long = [j for j, count in enumerate(n_tokens) if count > limit]
    if not too_long:
        return
    j = too_long[0]
    index = positions[j]
    others = (
        f" ({len(too_long) - 1} more distinct sequences are too long)"
        if len(too_long) > 1
        else ""
    )
    msg = (
        f"{_item_name(names, index)}: a {len(seqs[j])} bp sequence is {n_tokens[j]} tokens "
        f"for {adapter.key.model_id}, whose maximum is {limit}{others}. Shorten it, or "
        "truncate explicitly (--truncate right), which is recorded in the key."
    )
    raise SequenceTooLongError(msg)


__all__ = [
    "EmbedPlan",
    "EmbedResult",
    "UnitResult",
    "WorkUnit",
    "adapter_keys",
    "cut_units",
    "plan_embedding",
    "unit_of_batches",
]
