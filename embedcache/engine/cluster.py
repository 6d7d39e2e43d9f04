"""The client side of the Dask path: plan here, embed and store on the workers.

The client runs the same planner as the in-process engine (validate, hash, length
check, store lookup) and hands the missing sequences out as work units of
consecutive length-sorted batches (:class:`~embedcache.engine.unit_queue.UnitQueue`),
one Dask task each. A task embeds its unit on a worker and commits it to the store
itself (:mod:`embedcache.engine.worker`); only counts travel back, and the client
then reads the vectors from the store.

Faults: a unit whose worker dies is rerun elsewhere by the scheduler, and a rerun
skips what its first run already committed; a unit is one commit per key, so a
killed unit leaves nothing half-stored. A worker's deterministic error fails the
run once with the worker's message instead of retrying.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import secrets
import time
from typing import TYPE_CHECKING, Any

from distributed import Client, as_completed
from tqdm.auto import tqdm

from embedcache.engine.batching import batch_rule
from embedcache.engine.forward import collect_result
from embedcache.engine.plan import plan_embedding
from embedcache.engine.unit_queue import MAX_UNIT_TOKENS, MIN_UNIT_TOKENS, UnitQueue
from embedcache.engine.worker import (
    PLUGIN_NAME,
    EmbedcacheWorker,
    UnitFailure,
    resolve_spec,
    run_unit_task,
    store_ref,
)
from embedcache.errors import ClusterError, EmbedcacheError
from embedcache.store import EmbeddingStore

if TYPE_CHECKING:
    import os
    from collections.abc import Mapping, Sequence

    from distributed import Future

    from embedcache.engine.plan import EmbedResult, UnitResult, WorkUnit
    from embedcache.engine.worker import AdapterSpec, StoreRef
    from embedcache.models.options import EmbedOptions
    from embedcache.specs import ModelKey

logger = logging.getLogger(__name__)

# a unit that raises something unexpected (a transient filesystem error, say) runs
# again this many times; a unit whose worker dies is rerun by the scheduler anyway
DEFAULT_RETRIES = 2


def embed_on_cluster(
    client: Client,
    model: str,
    seqs: Sequence[str],
    store: EmbeddingStore | str | os.PathLike[str],
    *,
    revision: str | None = None,
    options: EmbedOptions | Mapping[str, Any] | None = None,
    names: Sequence[str] | None = None,
    token_budget: int | None = None,
    unit_tokens: int | None = None,
    retries: int = DEFAULT_RETRIES,
    store_options: Mapping[str, str] | None = None,
    progress: bool = False,
) -> EmbedResult:
    """Embed ``seqs`` with ``model`` on the Dask cluster behind ``client``.

    The same result as :func:`embedcache.engine.local.embed_sequences` (vectors in input
    order, computed/cached counts), with the missing sequences computed by the
    workers and written by them into ``store``, which every worker must reach at
    the same location. For notebooks::

        from distributed import Client
        client = Client("tcp://scheduler:8786")
        result = embed_on_cluster(client, "kmer-4", seqs, "/shared/store")

    Parameters
    ----------
    model
        Built-in name, local directory (the same path on every worker) or hub id
        (resolved to a commit here; workers need hub access or a shared HF cache).
    store
        The store, or its location (a folder or an s3://, gs://, az:// URL); workers
        open it from its location, with ``store_options``.
    options
        :class:`EmbedOptions` or its fields. The client builds the adapter on the CPU
        to count tokens and name the keys; workers build it on ``options.device``.
    unit_tokens
        Sequence tokens per work unit; None sizes each unit to about
        :data:`~embedcache.engine.unit_queue.TARGET_UNIT_SECONDS` of a worker's measured rate
        (:func:`~embedcache.engine.unit_queue.next_unit_tokens`).
    retries
        Extra attempts for a unit that raises something unexpected.

    Raises
    ------
    InvalidSequenceError, SequenceTooLongError
        Found by the planner before anything runs; the store is unchanged.
    StoreError
        The store is in memory, or a worker cannot open it.
    ClusterError
        A unit failed on a worker (the worker's own error is raised instead when it
        is an embedcache error, with a note naming the worker).
    """
    spec = resolve_spec(model, revision=revision, options=options)
    ref = store_ref(store, options=store_options)
    client_store = store if isinstance(store, EmbeddingStore) else ref.open(create=True)
    adapter = spec.load(device="cpu")
    key, dim, alias = adapter.key, adapter.dim, getattr(adapter, "alias", None)
    plan = plan_embedding(adapter, seqs, client_store, names=names, progress=progress)
    if plan.n_computed:
        # the adapter's own budget, not one timed here: the workers may run on
        # another kind of machine than this client
        rule = batch_rule(adapter, token_budget)
        if rule.token_budget > MAX_UNIT_TOKENS:
            # a batch never spans units: a budget beyond any unit is a k-mer floor's,
            # whose vectors do not depend on the batch, so cut it down. Any other
            # budget is kept, so the batches (and the floats) are the in-process
            # engine's; a unit holds at least one whole batch
            rule = dataclasses.replace(
                rule, token_budget=unit_tokens or MIN_UNIT_TOKENS
            )
        queue = UnitQueue.from_plan(plan, rule=rule, unit_tokens=unit_tokens)
        del adapter  # the workers hold the model from here on
        run_units(
            client,
            spec,
            ref,
            plan.keys,
            queue,
            retries=retries,
            progress=progress,
            desc=f"embed {key.model_id}",
        )
    return collect_result(
        client_store, plan, key=key, dim=dim, alias=alias, progress=progress
    )


def run_units(
    client: Client,
    spec: AdapterSpec,
    ref: StoreRef,
    keys: tuple[ModelKey, ...],
    units: UnitQueue | Sequence[WorkUnit],
    *,
    retries: int = DEFAULT_RETRIES,
    progress: bool = False,
    desc: str = "embed",
) -> list[UnitResult]:
    """Run work units as Dask tasks, the longest sequences first; return their counts.

    At most three units per worker are queued at once, so the scheduler holds only
    their sequences, a queue from a plan sizes each next unit by the rate measured
    so far, and the first failure stops the run.

    Raises
    ------
    EmbedcacheError
        A worker's own error (model load, store access, bad vector), raised once.
    ClusterError
        A unit failed otherwise (after ``retries``) or killed its workers.
    """
    todo = units if isinstance(units, UnitQueue) else UnitQueue.from_units(units)
    if not todo:
        return []
    try:
        client.register_plugin(EmbedcacheWorker(), name=PLUGIN_NAME)
    except Exception as err:
        msg = (
            f"cannot set up embedcache on the workers of {client.scheduler.address}: "
            f"{type(err).__name__}: {err}. Every worker needs embedcache installed "
            "(the same version as the client)."
        )
        raise ClusterError(msg) from err
    logger.info(
        "%d sequences (%d tokens) to embed on %s; dashboard: %s",
        todo.n_seqs,
        todo.remaining_tokens,
        client.scheduler.address,
        client.dashboard_link or "none (install bokeh)",
    )
    run_id = secrets.token_hex(4)
    results: list[UnitResult] = []
    pending: set[Future] = set()
    finished = as_completed()
    start = time.perf_counter()
    done_tokens = done_seqs = 0
    busy_tokens, busy_s = 0, 0.0  # computed tokens and the seconds units took
    n_workers, asked = 0, -math.inf  # the worker count, asked at most every 2 s

    def submit_more() -> None:
        nonlocal n_workers, asked
        if time.monotonic() - asked > 2.0:  # a round trip to the scheduler
            n_workers, asked = len(client.nthreads()), time.monotonic()
        rate = busy_tokens / busy_s if busy_tokens and busy_s > 0 else None
        while todo and len(pending) < max(8, 3 * n_workers):
            unit = todo.next_unit(tokens_per_s=rate, n_workers=n_workers)
            future = client.submit(
                run_unit_task,
                spec,
                ref,
                keys,
                unit,
                key=f"embedcache-unit-{run_id}-{unit.index:06d}",
                retries=retries,
                pure=False,
            )
            pending.add(future)
            finished.add(future)

    try:
        with tqdm(
            total=todo.n_seqs, desc=desc, unit="seq", disable=not progress
        ) as bar:
            submit_more()
            for future in finished:
                pending.discard(future)
                outcome = _outcome(future)
                if isinstance(outcome, UnitFailure):
                    err = outcome.error
                    err.add_note(f"unit {outcome.index} on worker {outcome.worker}")
                    raise err
                results.append(outcome)
                done_seqs += outcome.n_seqs
                done_tokens += outcome.n_tokens
                if outcome.n_tokens:
                    busy_tokens += outcome.n_tokens
                    busy_s += outcome.seconds
                rate = done_tokens / max(time.perf_counter() - start, 1e-9)
                bar.update(outcome.n_seqs)
                bar.set_postfix_str(
                    f"{len(results)} units, {rate:,.0f} tok/s", refresh=False
                )
                submit_more()
    finally:
        if pending:
            client.cancel(list(pending))
    elapsed = time.perf_counter() - start
    logger.info(
        "cluster computed %d sequences (%d tokens) in %d units, %.1f s: %.0f tokens/s",
        sum(r.n_computed for r in results),
        done_tokens,
        len(results),
        elapsed,
        done_tokens / max(elapsed, 1e-9),
    )
    return results


def _outcome(future: Future) -> UnitResult | UnitFailure:
    from distributed import KilledWorker

    try:
        return future.result()
    except KilledWorker as err:
        msg = (
            f"work unit {future.key} was running each time a worker died ({err}); it "
            "probably exhausts the worker's memory: lower --unit-tokens or "
            "--token-budget, or give workers more memory"
        )
        raise ClusterError(msg) from err
    except EmbedcacheError:
        raise
    except Exception as err:
        msg = (
            f"work unit {future.key} failed on the cluster: {type(err).__name__}: {err}"
        )
        raise ClusterError(msg) from err


__all__ = ["DEFAULT_RETRIES", "embed_on_cluster", "run_units"]
