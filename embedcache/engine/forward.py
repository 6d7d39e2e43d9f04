"""Forward and commit: a work unit through the adapter into the store, and back out.

Both execution paths run units through :func:`run_unit` (in this process, or on a
Dask worker), then :func:`collect_result` records a local model's alias and reads
the vectors back from the store in input order.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import TYPE_CHECKING

import numpy as np
from tqdm.auto import tqdm

from embedcache.engine.plan import LOOKUP_CHUNK, EmbedResult, UnitResult, adapter_keys
from embedcache.errors import (
    DimensionMismatchError,
    InvalidSequenceError,
    MissingEmbeddingsError,
)
from embedcache.store.index import to_hex

if TYPE_CHECKING:
    from collections.abc import Sequence

    from embedcache.engine.plan import EmbedPlan, WorkUnit
    from embedcache.models.base import Adapter
    from embedcache.models.shared.tuning import Tuner
    from embedcache.specs import ModelKey
    from embedcache.store import EmbeddingStore


# vectors per store read of the read-back: the rows of a chunk are scattered over
# every run, so a read's temporaries grow with it (16 MiB: 65,536 rows at dim 64)
READ_BYTES = 1 << 24


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


def inference_mode() -> contextlib.AbstractContextManager:
    """torch's inference mode when an adapter runs torch, else nothing."""
    # adapters that run torch have imported it; the k-mer floors never pay its import
    torch = sys.modules.get("torch")
    return torch.inference_mode() if torch is not None else contextlib.nullcontext()


def kernel_tuner() -> Tuner | None:
    """This process's kernel tuner when torch is loaded, else None (the k-mer
    floors never pay for it). The choices it makes during a unit's forward passes
    are recorded in the unit's commits; a unit that ran no tuned kernel records
    none."""
    if "torch" not in sys.modules:
        return None
    from embedcache.models.shared.tuning import process_tuner

    return process_tuner()


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
    those an uninterrupted run computes. The result times the model's passes and the
    store's writes apart (``forward_seconds``, ``commit_seconds``).

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
    parts = []
    forward_start = time.perf_counter()
    tuner = kernel_tuner()
    recording = tuner.recording() if tuner else contextlib.nullcontext({})
    with inference_mode(), recording as used:
        for batch in batches:
            parts.append(embed_outputs(adapter, [unit.seqs[i] for i in batch]))
    outputs = np.concatenate(parts, axis=1)
    hashes = [unit.hashes[i] for i in rows]
    for output_key, vectors in zip(keys, outputs, strict=True):
        finite = np.isfinite(vectors).all(axis=1)
        if not finite.all():
            row = rows[int(np.flatnonzero(~finite)[0])]
            # its hash and length, never its bases: the message reaches server logs
            msg = (
                f"{output_key.short()} produced a non-finite vector for the sequence "
                f"of sha256 {unit.hashes[row][:16]} (length {len(unit.seqs[row])})"
            )
            raise InvalidSequenceError(msg)
    # a local model's folder name, recorded beside its content-digest key
    alias = getattr(adapter, "alias", None)
    named: dict[str, object] = {"alias": alias} if alias else {}
    if tuner is not None and used:  # what computed them: in the commit, not the key
        named["kernels"] = tuner.kernel_record(used)
    commit_start = time.perf_counter()
    for output_key, vectors in zip(keys, outputs, strict=True):
        store.put(output_key, hashes, vectors, **named)
    committed = time.perf_counter()
    n_tokens = sum(unit.tokens[i] for i in rows)
    return UnitResult(
        unit.index,
        unit.n_seqs,
        len(rows),
        n_tokens,
        committed - start,
        forward_seconds=commit_start - forward_start,
        commit_seconds=committed - commit_start,
    )


def record_alias(store: EmbeddingStore, plan: EmbedPlan, alias: str | None) -> None:
    """Record a local model's folder name beside each of its keys, also when every
    vector was cached (a renamed copy hits the cache; the new name is still shown).

    Re-putting one stored vector with the alias is a no-op once the key lists it.
    """
    if not alias or not len(plan.digests):
        return
    first = to_hex(plan.digests[:1])
    for key in plan.keys:
        vector, found = store.get(key, first)
        if found.all():
            store.put(key, first, vector, alias=alias)


def gather_vectors(
    store: EmbeddingStore,
    plan: EmbedPlan,
    key: ModelKey,
    dim: int,
    *,
    progress: bool = False,
    refresh: bool = True,
) -> np.ndarray:
    """The plan's vectors under ``key`` from the store, one row per input, float32.

    Read at most :data:`~embedcache.engine.plan.LOOKUP_CHUNK` rows and
    :data:`READ_BYTES` of vectors at a time into the result, so beside it only one
    chunk's vectors are held. ``refresh``: list the key's commits first, as other
    processes (a cluster's workers) committed the rows; a server, whose own commits
    join its view as they are made, reads its view as it stands.

    Raises
    ------
    MissingEmbeddingsError
        A planned vector is not in the store (it was not computed).
    """
    n = len(plan.digests)
    out = np.empty((n, dim), dtype=np.float32)
    read_into = getattr(store, "read_into", None)
    if read_into is not None:  # the store's bulk read: linear in n and the key
        if refresh and hasattr(store, "refresh"):
            store.refresh(key)  # other processes (a cluster's workers) committed
        with tqdm(total=n, desc="read back", unit="seq", disable=not progress) as bar:
            found = read_into(key, plan.digests, out)
            bar.update(n)
        if not found.all():
            rows = np.flatnonzero(~found)
            msg = (
                f"{len(rows)} of {n} rows (first: row {int(rows[0])}) have no vector "
                "in the store after embedding"
            )
            raise MissingEmbeddingsError(msg)
        return out
    step = max(1, min(LOOKUP_CHUNK, READ_BYTES // (4 * max(dim, 1))))
    with tqdm(
        total=n, desc="read back", unit="seq", disable=not progress, mininterval=0.5
    ) as bar:
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            stored, found = store.get(key, to_hex(plan.digests[lo:hi]))
            if not np.all(found):
                n_missing = int((~np.asarray(found)).sum())
                msg = (
                    f"{n_missing} of rows {lo}-{hi - 1} ({n} in all) have no vector "
                    "in the store after embedding"
                )
                raise MissingEmbeddingsError(msg)
            out[lo:hi] = stored
            bar.update(hi - lo)
    return out


def collect_result(
    store: EmbeddingStore,
    plan: EmbedPlan,
    *,
    key: ModelKey,
    dim: int,
    alias: str | None,
    progress: bool = False,
) -> EmbedResult:
    """The call's result once every unit is committed: the alias recorded, the
    vectors under ``key`` read back in input order, the plan's counts and keys."""
    record_alias(store, plan, alias)
    return EmbedResult(
        vectors=gather_vectors(store, plan, key, dim, progress=progress),
        n_computed=plan.n_computed,
        n_cached=plan.n_cached,
        keys=plan.keys,
    )


__all__ = [
    "collect_result",
    "embed_outputs",
    "gather_vectors",
    "inference_mode",
    "record_alias",
    "run_unit",
]
