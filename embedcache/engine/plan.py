"""Plan: what one embedding call has to do, decided before anything is computed.

Validate, hash and length-check every sequence, look the distinct ones up in the
store, and cut the missing ones into work units of whole batches. The records here
(:class:`EmbedPlan`, :class:`WorkUnit`, :class:`UnitResult`, :class:`EmbedResult`)
are plain data that both execution paths pass along.

Memory: a plan holds no Python object per sequence. It keeps each row's raw sha256
(32 bytes) and, per distinct sequence to compute, its input row and token count
(16 bytes); sequences are read from the caller's list when their unit is cut, and
every pass over the rows (hash, look up, read back) goes in chunks of
:data:`LOOKUP_CHUNK`. A million short sequences then plan in ~50 MB of arrays
beside the caller's list (32 MB of digests, 16 MB for the rows to compute).

Counting convention of :class:`EmbedResult`: ``n_computed`` is the number of distinct
sequences run through the model in this call; every other input row is ``n_cached``,
including repeats of a sequence computed earlier in the same call. So
``n_computed + n_cached == len(seqs)`` and a second identical call reports
``n_computed == 0``.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from tqdm.auto import tqdm

from embedcache.data.seqfile import validate_sequence
from embedcache.engine.batching import batch_bounds
from embedcache.errors import SequenceTooLongError
from embedcache.hashing import normalise_sequence, sequence_digest
from embedcache.store.index import first_rows, to_hex

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from embedcache.engine.batching import BatchRule
    from embedcache.models.base import Adapter
    from embedcache.specs import ModelKey
    from embedcache.store import EmbeddingStore

logger = logging.getLogger(__name__)

# rows per hashing step, store look-up and read-back call: a progress step, and a
# bounded temporary (hex strings and vectors of one chunk)
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


@dataclass(frozen=True, eq=False)
class EmbedPlan:
    """What one embedding call has to do, decided before anything is computed.

    ``digests`` has one raw sha256 per input row; ``missing_rows`` and
    ``missing_tokens`` describe the distinct sequences that at least one of ``keys``
    lacks (the input row of each one's first occurrence, its token count), in
    first-occurrence order. ``seqs`` is the caller's input, validated: a unit reads
    its sequences there.
    """

    keys: tuple[ModelKey, ...]
    seqs: Sequence[str]
    digests: np.ndarray  # (n,) S32
    n_unique: int
    missing_rows: np.ndarray  # (m,) int64
    missing_tokens: np.ndarray  # (m,) int64

    @property
    def n_computed(self) -> int:
        return len(self.missing_rows)

    @property
    def n_cached(self) -> int:
        return len(self.digests) - len(self.missing_rows)

    # hex and string views, one Python object per row: for a request-sized plan
    @property
    def hashes(self) -> list[str]:
        """Each input row's sequence key (hex)."""
        return to_hex(self.digests)

    @property
    def missing_hashes(self) -> list[str]:
        """The sequence key of each distinct sequence to compute (hex)."""
        return to_hex(self.digests[self.missing_rows])

    @property
    def missing_seqs(self) -> list[str]:
        """Each distinct sequence to compute, normalised."""
        return [normalise_sequence(self.seqs[i]) for i in self.missing_rows.tolist()]


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
    forward_seconds: float = 0.0  # of ``seconds``: the model's passes
    commit_seconds: float = 0.0  # of ``seconds``: the store's writes


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
    digests = _hash_all(seqs, names, progress=progress)
    # one computation per distinct sequence, at its first occurrence; looked up in
    # hash order, so each look-up reads only its own range of the store's index
    by_digest = first_rows(digests)
    unique_rows = np.sort(by_digest)

    # a sequence is computed when any of the adapter's keys (layers) lacks it
    keys = adapter_keys(adapter)
    stored = np.ones(len(digests), dtype=bool)  # by input row
    with tqdm(
        total=len(unique_rows) * len(keys),
        desc="look up",
        unit="seq",
        disable=not progress,
        mininterval=0.5,
    ) as bar:
        for output_key in keys:
            for lo in range(0, len(by_digest), LOOKUP_CHUNK):
                part = by_digest[lo : lo + LOOKUP_CHUNK]
                stored[part] &= np.asarray(
                    store.contains(output_key, to_hex(digests[part])), dtype=bool
                )
                bar.update(len(part))
    del by_digest
    missing_rows = unique_rows[~stored[unique_rows]]
    del stored
    n_tokens = _count_tokens(adapter, seqs, missing_rows)
    _check_lengths(adapter, n_tokens, missing_rows, seqs, names)
    logger.info(
        "%s: %d sequences, %d distinct, %d to compute",
        adapter.key.short(),
        n,
        len(unique_rows),
        len(missing_rows),
    )
    return EmbedPlan(
        keys=keys,
        seqs=seqs,
        digests=digests,
        n_unique=len(unique_rows),
        missing_rows=missing_rows,
        missing_tokens=n_tokens,
    )


def iter_units(
    plan: EmbedPlan,
    *,
    rule: BatchRule,
    unit_tokens: int,
) -> Iterator[WorkUnit]:
    """Cut a plan's missing sequences into work units of about ``unit_tokens`` tokens,
    one at a time (only the unit being run holds its sequences).

    The batches are exactly those of :func:`~embedcache.engine.batching.batch_bounds`
    over all missing sequences (so vectors do not depend on how they are grouped
    into units); consecutive batches join a unit until it holds ``unit_tokens``
    sequence tokens. With ``unit_tokens`` of 1 every batch is its own unit.
    """
    if unit_tokens < 1:
        msg = f"unit size must be a positive number of tokens, got {unit_tokens}"
        raise ValueError(msg)
    order, bounds = batch_bounds(plan.missing_tokens, rule)
    current: list[np.ndarray] = []
    size = index = 0
    for lo, hi in itertools.pairwise(bounds.tolist()):
        batch = order[lo:hi]
        current.append(batch)
        size += int(plan.missing_tokens[batch].sum())
        if size >= unit_tokens:
            yield unit_of_batches(plan, current, index=index)
            current, size, index = [], 0, index + 1
    if current:
        yield unit_of_batches(plan, current, index=index)


def cut_units(
    plan: EmbedPlan,
    *,
    rule: BatchRule,
    unit_tokens: int,
) -> list[WorkUnit]:
    """Every unit of :func:`iter_units` at once (holds every missing sequence)."""
    return list(iter_units(plan, rule=rule, unit_tokens=unit_tokens))


def unit_of_batches(
    plan: EmbedPlan, batches: Sequence[Sequence[int] | np.ndarray], *, index: int
) -> WorkUnit:
    """The work unit of ``batches`` (positions into the plan's missing sequences)."""
    parts = [np.asarray(batch, dtype=np.int64) for batch in batches]
    rows = np.concatenate(parts) if parts else np.empty(0, np.int64)
    input_rows = plan.missing_rows[rows]
    # the unit lists its batches' sequences in order: batch k is a run of positions
    ends = np.cumsum([len(part) for part in parts]).tolist()
    starts = [0, *ends[:-1]]
    return WorkUnit(
        index=index,
        seqs=tuple(normalise_sequence(plan.seqs[i]) for i in input_rows.tolist()),
        hashes=tuple(to_hex(plan.digests[input_rows])),
        tokens=tuple(plan.missing_tokens[rows].tolist()),
        batches=tuple(tuple(range(a, b)) for a, b in zip(starts, ends, strict=True)),
    )


def _hash_all(
    seqs: Sequence[str], names: Sequence[str] | None, *, progress: bool
) -> np.ndarray:
    """Validate every sequence and return its raw sha256, (n,) S32, chunk by chunk."""
    n = len(seqs)
    digests = np.empty(n, dtype="S32")
    with tqdm(
        total=n, desc="hash", unit="seq", disable=not progress, mininterval=0.5
    ) as bar:
        for lo in range(0, n, LOOKUP_CHUNK):
            hi = min(n, lo + LOOKUP_CHUNK)
            raw = b"".join(
                sequence_digest(validate_sequence(seqs[i], _item_name(names, i)))
                for i in range(lo, hi)
            )
            digests[lo:hi] = np.frombuffer(raw, dtype="S32")
            bar.update(hi - lo)
    return digests


def _item_name(names: Sequence[str] | None, index: int) -> str:
    return names[index] if names is not None else f"sequence #{index} (0-based)"


def _count_tokens(
    adapter: Adapter, seqs: Sequence[str], rows: np.ndarray
) -> np.ndarray:
    """Token counts of ``seqs[rows]`` (int64), a chunk of sequences at a time."""
    many = getattr(adapter, "n_tokens_many", None)
    out = np.empty(len(rows), dtype=np.int64)
    for lo in range(0, len(rows), LOOKUP_CHUNK):
        part = [
            normalise_sequence(seqs[i]) for i in rows[lo : lo + LOOKUP_CHUNK].tolist()
        ]
        counts = many(part) if many is not None else map(adapter.n_tokens, part)
        out[lo : lo + len(part)] = list(counts)
    return out


def refuse_too_long(
    adapter: Adapter, seqs: Sequence[str], names: Sequence[str] | None = None
) -> None:
    """Raise for the first of ``seqs`` longer than the model takes (the check
    :func:`plan_embedding` makes of what it computes), when the key truncates nothing.

    Raises
    ------
    SequenceTooLongError
        A sequence exceeds the model's maximum and the key names no truncation policy.
    """
    if adapter.max_tokens is None or adapter.key.truncation != "error":
        return
    rows = np.arange(len(seqs))
    _check_lengths(adapter, _count_tokens(adapter, seqs, rows), rows, seqs, names)


def _check_lengths(
    adapter: Adapter,
    n_tokens: np.ndarray,
    rows: np.ndarray,
    seqs: Sequence[str],
    names: Sequence[str] | None,
) -> None:
    """Raise for the first too-long sequence; ``n_tokens`` and ``rows`` (input rows)
    describe the distinct sequences to compute, aligned."""
    limit = adapter.max_tokens
    if limit is None or adapter.key.truncation != "error":
        return
    too_long = np.flatnonzero(n_tokens > limit)
    if not len(too_long):
        return
    j = int(too_long[0])
    index = int(rows[j])
    others = (
        f" ({len(too_long) - 1} more distinct sequences are too long)"
        if len(too_long) > 1
        else ""
    )
    msg = (
        f"{_item_name(names, index)}: a {len(seqs[index])} bp sequence is "
        f"{int(n_tokens[j])} tokens for {adapter.key.model_id}, whose maximum is "
        f"{limit}{others}. Shorten it, or truncate explicitly (--truncate right), "
        "which is recorded in the key."
    )
    raise SequenceTooLongError(msg)


__all__ = [
    "EmbedPlan",
    "EmbedResult",
    "UnitResult",
    "WorkUnit",
    "adapter_keys",
    "cut_units",
    "iter_units",
    "plan_embedding",
    "refuse_too_long",
    "unit_of_batches",
]
