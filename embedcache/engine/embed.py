"""The batching engine: store lookup, only-missing computation, length-bucketed batches.

Counting convention of :class:`EmbedResult`: ``n_computed`` is the number of distinct
sequences run through the model in this call; every other input row is ``n_cached``,
including repeats of a sequence computed earlier in the same call. So
``n_computed + n_cached == len(seqs)`` and a second identical call reports
``n_computed == 0``.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from tqdm.auto import tqdm

from embedcache.data.seqfile import validate_sequence
from embedcache.errors import (
    DimensionMismatchError,
    InvalidSequenceError,
    MissingEmbeddingsError,
    SequenceTooLongError,
)
from embedcache.hashing import sequence_key
from embedcache.models.base import DEFAULT_TOKEN_BUDGET

if TYPE_CHECKING:
    from collections.abc import Sequence

    from embedcache.models.base import Adapter
    from embedcache.specs import ModelKey
    from embedcache.store import EmbeddingStore

logger = logging.getLogger(__name__)

# Attention score elements (sequences x score maps x longest^2) per forward pass and
# layer: 2^27 is 256 MiB in bf16. Scores grow with the square of the length while the
# rest of a forward pass grows linearly, so long sequences batch fewer at a time (one
# sequence always runs, however long).
ATTENTION_SCORE_BUDGET = 2**27


@dataclass(frozen=True)
class EmbedResult:
    """Vectors in input order (float32, (n, dim)) and what was computed vs found."""

    vectors: np.ndarray
    n_computed: int
    n_cached: int


@dataclass(frozen=True)
class BatchRule:
    """Which sequences share a forward pass.

    A batch of ``count`` sequences whose longest has ``longest`` tokens fits when its
    padded tokens (``count * longest``) stay within ``token_budget`` and its attention
    scores (``count * attention_maps * longest**2``) within ``score_budget``; with
    ``equal_lengths`` only sequences of one token count go together.
    """

    token_budget: int
    equal_lengths: bool = False
    attention_maps: int = 0  # score matrices a sequence adds; 0: no attention
    score_budget: int = ATTENTION_SCORE_BUDGET

    def __post_init__(self) -> None:
        if self.token_budget < 1:
            msg = f"token budget must be positive, got {self.token_budget}"
            raise ValueError(msg)

    def fits(self, count: int, longest: int) -> bool:
        """Whether ``count`` sequences of at most ``longest`` tokens make one batch."""
        if count * longest > self.token_budget:
            return False
        scores = count * self.attention_maps * longest * longest
        return scores <= self.score_budget


def batch_rule(adapter: Adapter, token_budget: int | None = None) -> BatchRule:
    """The adapter's batching: the given token budget, else its preferred one, else the
    default; its attention score maps per sequence; equal lengths if it needs them."""
    if token_budget is None:
        token_budget = getattr(adapter, "preferred_token_budget", DEFAULT_TOKEN_BUDGET)
    return BatchRule(
        token_budget=int(token_budget),
        equal_lengths=bool(adapter.needs_equal_lengths),
        attention_maps=int(getattr(adapter, "attention_maps", 0)),
    )


def plan_batches(n_tokens: Sequence[int], rule: BatchRule) -> list[list[int]]:
    """Group indices into batches by length: sorted by token count, each batch as large
    as ``rule`` allows (at least one item).
    """
    order = sorted(range(len(n_tokens)), key=lambda i: (n_tokens[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        length = n_tokens[index]
        if current:
            # sorted ascending: this item is the longest in the batch so far
            too_big = not rule.fits(len(current) + 1, length)
            new_length = rule.equal_lengths and length != n_tokens[current[0]]
            if too_big or new_length:
                batches.append(current)
                current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


def adapter_keys(adapter: Adapter) -> tuple[ModelKey, ...]:
    """Every key one forward pass of ``adapter`` fills (several in a layer sweep)."""
    return tuple(getattr(adapter, "keys", None) or (adapter.key,))


def embed_outputs(adapter: Adapter, seqs: Sequence[str]) -> np.ndarray:
    """Float32 (len(keys), len(seqs), dim): one batch through the adapter, checked."""
    keys = adapter_keys(adapter)
    many = getattr(adapter, "embed_layers", None)
    outputs = np.asarray(
        many(seqs) if many is not None else adapter.embed_batch(seqs)[None],
        dtype=np.float32,
    )
    if outputs.shape != (len(keys), len(seqs), adapter.dim):
        msg = (
            f"{adapter.key.short()} returned vectors of shape {outputs.shape} for a batch "
            f"of {len(seqs)}; expected ({len(keys)}, {len(seqs)}, {adapter.dim})"
        )
        raise DimensionMismatchError(msg)
    return outputs


def _item_name(names: Sequence[str] | None, index: int) -> str:
    return names[index] if names is not None else f"sequence #{index} (0-based)"


def _count_tokens(adapter: Adapter, seqs: Sequence[str]) -> list[int]:
    many = getattr(adapter, "n_tokens_many", None)
    if many is not None:
        return list(many(seqs))
    return [adapter.n_tokens(seq) for seq in seqs]


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


def plan_embedding(
    adapter: Adapter,
    seqs: Sequence[str],
    store: EmbeddingStore,
    *,
    names: Sequence[str] | None = None,
) -> EmbedPlan:
    """Validate, hash and length-check every sequence, then look up the store.

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
    clean = [validate_sequence(seq, _item_name(names, i)) for i, seq in enumerate(seqs)]
    hashes = [sequence_key(seq) for seq in clean]

    # one computation per distinct sequence; remember where it first occurs for messages
    first_index: dict[str, int] = {}
    for i, digest in enumerate(hashes):
        first_index.setdefault(digest, i)
    unique = list(first_index)
    unique_seqs = [clean[first_index[h]] for h in unique]

    n_tokens = _count_tokens(adapter, unique_seqs)
    _check_lengths(adapter, n_tokens, [first_index[h] for h in unique], clean, names)

    # a sequence is computed when any of the adapter's keys (layers) lacks it
    keys = adapter_keys(adapter)
    found = np.ones(len(unique), dtype=bool)
    for output_key in keys:
        if unique:
            found &= np.asarray(store.contains(output_key, unique), dtype=bool)
    missing = np.flatnonzero(~found).tolist()
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
        missing_seqs=[unique_seqs[i] for i in missing],
        missing_hashes=[unique[i] for i in missing],
        missing_tokens=[n_tokens[i] for i in missing],
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


def run_unit(
    adapter: Adapter,
    store: EmbeddingStore,
    unit: WorkUnit,
    *,
    skip_stored: bool = False,
) -> UnitResult:
    """Embed one unit batch by batch and commit it to the store, once per key.

    With ``skip_stored``, batches whose every sequence the store already holds under
    every key are skipped (a rerun of a unit whose first run was committed by a
    worker that died before reporting). A batch is never split, so its vectors are
    those an uninterrupted run computes.

    Raises
    ------
    InvalidSequenceError
        The model produced a non-finite vector for a sequence; nothing of the unit
        is stored.
    """
    start = time.perf_counter()
    keys = adapter_keys(adapter)
    batches = list(unit.batches)
    if skip_stored and batches:
        stored = np.ones(unit.n_seqs, dtype=bool)
        for output_key in keys:
            stored &= np.asarray(store.contains(output_key, unit.hashes), dtype=bool)
        batches = [b for b in batches if not all(stored[i] for i in b)]
    rows = [i for batch in batches for i in batch]
    if not rows:
        return UnitResult(unit.index, unit.n_seqs, 0, 0, time.perf_counter() - start)
    # adapters that run torch have imported it; the k-mer floors never pay its import
    torch = sys.modules.get("torch")
    no_grad = torch.inference_mode() if torch is not None else contextlib.nullcontext()
    parts = []
    with no_grad:
        for batch in batches:
            parts.append(embed_outputs(adapter, [unit.seqs[i] for i in batch]))
    outputs = np.concatenate(parts, axis=1)
    hashes = [unit.hashes[i] for i in rows]
    for output_key, vectors in zip(keys, outputs, strict=True):
        finite = np.isfinite(vectors).all(axis=1)
        if not finite.all():
            seq = unit.seqs[rows[int(np.flatnonzero(~finite)[0])]]
            msg = f"{output_key.short()} produced a non-finite vector for sequence {seq[:40]!r}..."
            raise InvalidSequenceError(msg)
    # a local model's folder name, recorded beside its content-digest key
    alias = getattr(adapter, "alias", None)
    named = {"alias": alias} if alias else {}
    for output_key, vectors in zip(keys, outputs, strict=True):
        store.put(output_key, hashes, vectors, **named)
    n_tokens = sum(unit.tokens[i] for i in rows)
    return UnitResult(
        unit.index, unit.n_seqs, len(rows), n_tokens, time.perf_counter() - start
    )


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

    Parameters
    ----------
    names
        Item names for error messages (e.g. ``"line 3"`` or an item id), one per sequence.
    token_budget
        Upper bound on padded tokens (longest item x batch size) per forward pass;
        None takes the adapter's ``preferred_token_budget`` if it has one, else
        :data:`DEFAULT_TOKEN_BUDGET` (see :func:`batch_rule`).

    Raises
    ------
    InvalidSequenceError
        A sequence is empty or holds a character other than A/C/G/T/N.
    SequenceTooLongError
        A sequence exceeds the model's maximum and the key names no truncation policy.
    """
    rule = batch_rule(adapter, token_budget)
    plan = plan_embedding(adapter, seqs, store, names=names)
    if plan.missing_hashes:
        # one batch a unit: each batch is committed as soon as it is computed
        units = cut_units(
            plan,
            rule=rule,
            unit_tokens=1,
        )
        _run_units(adapter, store, units, progress=progress)
    record_alias(store, plan, getattr(adapter, "alias", None))
    vectors = gather_vectors(store, plan, adapter.key, adapter.dim)
    return EmbedResult(
        vectors=vectors, n_computed=plan.n_computed, n_cached=plan.n_cached
    )


def _check_lengths(
    adapter: Adapter,
    n_tokens: Sequence[int],
    positions: Sequence[int],
    seqs: Sequence[str],
    names: Sequence[str] | None,
) -> None:
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
        f"{_item_name(names, index)}: a {len(seqs[index])} bp sequence is {n_tokens[j]} tokens "
        f"for {adapter.key.model_id}, whose maximum is {limit}{others}. Shorten it, or "
        "truncate explicitly (--truncate right), which is recorded in the key."
    )
    raise SequenceTooLongError(msg)


def _run_units(
    adapter: Adapter,
    store: EmbeddingStore,
    units: Sequence[WorkUnit],
    *,
    progress: bool,
) -> None:
    total_tokens = 0
    n_seqs = sum(unit.n_seqs for unit in units)
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
            logger.debug(
                "stored batch %d/%d (%d sequences)", number, len(units), unit.n_seqs
            )
    elapsed = time.perf_counter() - start
    logger.info(
        "computed %d sequences (%d tokens) in %.1f s: %.1f seq/s, %.0f tokens/s",
        n_seqs,
        total_tokens,
        elapsed,
        n_seqs / max(elapsed, 1e-9),
        total_tokens / max(elapsed, 1e-9),
    )


def record_alias(store: EmbeddingStore, plan: EmbedPlan, alias: str | None) -> None:
    """Record a local model's folder name beside each of its keys, also when every
    vector was cached (a renamed copy hits the cache; the new name is still shown).

    Re-putting one stored vector with the alias is a no-op once the key lists it.
    """
    if not alias or not plan.unique:
        return
    first = [plan.unique[0]]
    for key in plan.keys:
        vector, found = store.get(key, first)
        if found.all():
            store.put(key, first, vector, alias=alias)


def gather_vectors(
    store: EmbeddingStore, plan: EmbedPlan, key: ModelKey, dim: int
) -> np.ndarray:
    """The plan's vectors under ``key`` from the store, one row per input, float32.

    Raises
    ------
    MissingEmbeddingsError
        A planned vector is not in the store (it was not computed).
    """
    unique, hashes = plan.unique, plan.hashes
    if not unique:
        return np.zeros((0, dim), dtype=np.float32)
    stored, found = store.get(key, unique)
    if not np.all(found):
        n_missing = int((~np.asarray(found)).sum())
        msg = f"{n_missing} of {len(unique)} vectors are still missing from the store after embedding"
        raise MissingEmbeddingsError(msg)
    row_of = {digest: row for row, digest in enumerate(unique)}
    return np.asarray(stored, dtype=np.float32)[[row_of[h] for h in hashes]]


__all__ = [
    "ATTENTION_SCORE_BUDGET",
    "DEFAULT_TOKEN_BUDGET",
    "BatchRule",
    "EmbedPlan",
    "EmbedResult",
    "UnitResult",
    "WorkUnit",
    "adapter_keys",
    "batch_rule",
    "cut_units",
    "embed_outputs",
    "embed_sequences",
    "gather_vectors",
    "plan_batches",
    "plan_embedding",
    "record_alias",
    "run_unit",
    "unit_of_batches",
]
