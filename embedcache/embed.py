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

from embedcache.errors import (
    DimensionMismatchError,
    InvalidSequenceError,
    MissingEmbeddingsError,
    SequenceTooLongError,
)
from embedcache.hashing import sequence_key
from embedcache.seqfile import validate_sequence

if TYPE_CHECKING:
    from collections.abc import Sequence

    from embedcache.models.base import Adapter
    from embedcache.specs import ModelKey
    from embedcache.store import EmbeddingStore

logger = logging.getLogger(__name__)

# Padded tokens (longest item x batch size) per forward pass. Measured with
# benchmarks/embed_bench.py on an NT-v2-50M-shaped encoder in bf16 (251/500 bp):
# batches of ~1-1.5k tokens ran at ~60% of the one-thread bf16 matmul peak, 2k at
# ~50%, 5.5k at ~40% (activations fall out of cache); fewer tokens per batch pay
# per-call overhead. Adapters may prefer another budget (``preferred_token_budget``).
DEFAULT_TOKEN_BUDGET = 1536


@dataclass(frozen=True)
class EmbedResult:
    """Vectors in input order (float32, (n, dim)) and what was computed vs found."""

    vectors: np.ndarray
    n_computed: int
    n_cached: int


def plan_batches(
    n_tokens: Sequence[int], *, token_budget: int, equal_lengths: bool = False
) -> list[list[int]]:
    """Group indices into batches by length: sorted by token count, each batch as large
    as ``max_len * count <= token_budget`` allows (at least one item), and, with
    ``equal_lengths``, only items of the same token count together.
    """
    if token_budget < 1:
        msg = f"token budget must be positive, got {token_budget}"
        raise ValueError(msg)
    order = sorted(range(len(n_tokens)), key=lambda i: (n_tokens[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        length = n_tokens[index]
        if current:
            # sorted ascending: this item is the longest in the batch so far
            too_big = length * (len(current) + 1) > token_budget
            new_length = equal_lengths and length != n_tokens[current[0]]
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
        :data:`DEFAULT_TOKEN_BUDGET`.

    Raises
    ------
    InvalidSequenceError
        A sequence is empty or holds a character other than A/C/G/T/N.
    SequenceTooLongError
        A sequence exceeds the model's maximum and the key names no truncation policy.
    """
    key = adapter.key
    n = len(seqs)
    if token_budget is None:
        token_budget = getattr(adapter, "preferred_token_budget", DEFAULT_TOKEN_BUDGET)
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
    found = np.ones(len(unique), dtype=bool)
    for output_key in adapter_keys(adapter):
        if unique:
            found &= np.asarray(store.contains(output_key, unique), dtype=bool)
    missing = np.flatnonzero(~found).tolist()
    logger.info(
        "%s: %d sequences, %d distinct, %d to compute",
        key.short(),
        n,
        len(unique),
        len(missing),
    )
    if missing:
        _compute_missing(
            adapter,
            store,
            [unique_seqs[i] for i in missing],
            [unique[i] for i in missing],
            [n_tokens[i] for i in missing],
            token_budget=token_budget,
            progress=progress,
        )

    vectors = _gather(store, key, unique, hashes, adapter.dim)
    return EmbedResult(
        vectors=vectors, n_computed=len(missing), n_cached=n - len(missing)
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


def _compute_missing(
    adapter: Adapter,
    store: EmbeddingStore,
    seqs: Sequence[str],
    hashes: Sequence[str],
    n_tokens: Sequence[int],
    *,
    token_budget: int,
    progress: bool,
) -> None:
    # adapters that run torch have imported it; the k-mer floors never pay its import
    torch = sys.modules.get("torch")
    no_grad = torch.inference_mode() if torch is not None else contextlib.nullcontext()
    key = adapter.key
    batches = plan_batches(
        n_tokens, token_budget=token_budget, equal_lengths=adapter.needs_equal_lengths
    )
    total_tokens = 0
    start = time.perf_counter()
    with (
        tqdm(
            total=len(seqs),
            desc=f"embed {key.model_id}",
            unit="seq",
            disable=not progress,
        ) as bar,
        no_grad,
    ):
        for number, batch in enumerate(batches, start=1):
            outputs = embed_outputs(adapter, [seqs[i] for i in batch])
            batch_hashes = [hashes[i] for i in batch]
            for output_key, vectors in zip(adapter_keys(adapter), outputs, strict=True):
                if not np.isfinite(vectors).all():
                    bad = np.flatnonzero(~np.isfinite(vectors).all(axis=1))[0]
                    row = batch[int(bad)]
                    msg = f"{output_key.short()} produced a non-finite vector for sequence {seqs[row][:40]!r}..."
                    raise InvalidSequenceError(msg)
                store.put(output_key, batch_hashes, vectors)
            total_tokens += sum(n_tokens[i] for i in batch)
            elapsed = max(time.perf_counter() - start, 1e-9)
            bar.update(len(batch))
            bar.set_postfix_str(f"{total_tokens / elapsed:,.0f} tok/s", refresh=False)
            logger.debug(
                "stored batch %d/%d (%d sequences)", number, len(batches), len(batch)
            )
    elapsed = time.perf_counter() - start
    logger.info(
        "computed %d sequences (%d tokens) in %.1f s: %.1f seq/s, %.0f tokens/s",
        len(seqs),
        total_tokens,
        elapsed,
        len(seqs) / max(elapsed, 1e-9),
        total_tokens / max(elapsed, 1e-9),
    )


def _gather(
    store: EmbeddingStore,
    key: ModelKey,
    unique: Sequence[str],
    hashes: Sequence[str],
    dim: int,
) -> np.ndarray:
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
    "DEFAULT_TOKEN_BUDGET",
    "EmbedResult",
    "adapter_keys",
    "embed_outputs",
    "embed_sequences",
    "plan_batches",
]
