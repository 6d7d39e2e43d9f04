"""Embedding on a Dask cluster: plan on the client, embed and store on the workers.

The client runs the same planner as the in-process engine (validate, hash, length
check, store lookup) and cuts the missing sequences into work units of consecutive
length-sorted batches, one Dask task each. A task embeds its unit on a worker and
commits it to the store itself; only counts travel back. Each worker process loads
the adapter once (:class:`EmbedcacheWorker`, a Dask worker plugin) and runs one unit
at a time with torch using all the worker's threads.

Faults: a unit whose worker dies is rerun elsewhere by the scheduler, and a rerun
skips what its first run already committed; a unit is one commit per key, so a
killed unit leaves nothing half-stored. An error that would repeat on every attempt
(the model does not load, the store cannot be opened, a non-finite vector) is
returned by the task, not raised, so the run fails once with the worker's message
instead of retrying.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import secrets
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distributed import Client, LocalCluster, as_completed, get_worker
from distributed.diagnostics.plugin import WorkerPlugin
from tqdm.auto import tqdm

from embedcache.engine.embed import (
    BatchRule,
    EmbedPlan,
    EmbedResult,
    UnitResult,
    WorkUnit,
    adapter_keys,
    batch_rule,
    gather_vectors,
    plan_batches,
    plan_embedding,
    record_alias,
    run_unit,
    unit_of_batches,
)
from embedcache.errors import ClusterError, EmbedcacheError, StoreError
from embedcache.models import BUILTIN_MODELS, load_adapter, resolve_hub_model
from embedcache.models.options import EmbedOptions
from embedcache.store import EmbeddingStore, is_url

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

    from distributed import Future, Worker

    from embedcache.models.base import Adapter
    from embedcache.specs import ModelKey

logger = logging.getLogger(__name__)

PLUGIN_NAME = "embedcache-worker"
# a unit that raises something unexpected (a transient filesystem error, say) runs
# again this many times; a unit whose worker dies is rerun by the scheduler anyway
DEFAULT_RETRIES = 2
# Unit size. A unit costs ~10-110 ms beyond its compute (the Dask round trip and one
# store commit per key; benchmarks/dask_bench.py, the high end on a saturated
# machine), so units are sized to about TARGET_UNIT_SECONDS of a worker's measured
# rate, and near the end of a job, to keep the tail short, down to half a worker's
# share of what is left but never below FLOOR_UNIT_SECONDS: overhead stays under 5%
# on CPUs and GPUs alike. The first units, before any rate is known, hold
# MIN_UNIT_TOKENS; MAX bounds what a killed worker's unit loses and what a unit holds.
TARGET_UNIT_SECONDS = 5.0
FLOOR_UNIT_SECONDS = 3.0
MIN_UNIT_TOKENS = 4_096
MAX_UNIT_TOKENS = 1_048_576


@dataclass(frozen=True, slots=True)
class AdapterSpec:
    """What a worker needs to build the client's adapter: model, revision, options.

    ``model`` is a built-in name, an absolute directory or a hub id whose ``revision``
    the client has resolved to a commit, so every worker loads the same weights.
    """

    model: str
    revision: str | None
    options: EmbedOptions

    def load(self, *, device: str | None = None) -> Adapter:
        """Build the adapter (on ``device`` instead of the options' device if given)."""
        options = self.options
        if device is not None:
            options = dataclasses.replace(options, device=device)
        return load_adapter(self.model, revision=self.revision, **options.to_dict())


@dataclass(frozen=True, slots=True)
class StoreRef:
    """Where the store is, as every worker opens it: a location string and options."""

    location: str
    options: tuple[tuple[str, str], ...] = ()

    def open(self, *, create: bool = False) -> EmbeddingStore:
        return EmbeddingStore(
            self.location, create=create, options=dict(self.options) or None
        )


@dataclass(frozen=True, slots=True)
class UnitFailure:
    """A task's deterministic error, returned (not raised) so it is not retried."""

    index: int
    worker: str
    error: BaseException


def resolve_spec(
    model: str,
    *,
    revision: str | None = None,
    options: EmbedOptions | Mapping[str, Any] | None = None,
) -> AdapterSpec:
    """Pin ``model`` for the workers: absolute path of a local directory, commit of a
    hub id (resolved here, on the client), built-in names as they are."""
    if options is None:
        options = EmbedOptions()
    elif not isinstance(options, EmbedOptions):
        options = EmbedOptions(**options)
    path = Path(model).expanduser()
    if model in BUILTIN_MODELS:
        return AdapterSpec(model, revision, options)
    if path.is_dir():
        return AdapterSpec(str(path.resolve()), revision, options)
    # a hub id (load_adapter names anything else): every worker gets its commit
    _, commit = resolve_hub_model(model, revision=revision)
    return AdapterSpec(model, commit, options)


def store_ref(
    store: EmbeddingStore | str | os.PathLike[str],
    *,
    options: Mapping[str, str] | None = None,
) -> StoreRef:
    """The location workers open: a URL as it is, a local path made absolute.

    ``options`` are the store's backend options (object-storage credentials and
    settings), sent with the location to every worker.
    """
    location = str(store.root if isinstance(store, EmbeddingStore) else store)
    if location.startswith("memory:"):
        msg = (
            f"store {location} lives in one process's memory; the workers cannot reach "
            "it. Use a folder on a shared filesystem or an object-store URL."
        )
        raise StoreError(msg)
    if not is_url(location):
        location = str(Path(location).expanduser().resolve())
    return StoreRef(location, tuple(sorted((options or {}).items())))


def next_unit_tokens(
    tokens_per_s: float | None, remaining_tokens: int, n_workers: int
) -> int:
    """Tokens for the next unit, from a worker's measured rate (None: not yet known).

    About :data:`TARGET_UNIT_SECONDS` of compute; less near the end of a job (half a
    worker's share of ``remaining_tokens``) but not under :data:`FLOOR_UNIT_SECONDS`;
    always within [:data:`MIN_UNIT_TOKENS`, :data:`MAX_UNIT_TOKENS`].
    """
    if tokens_per_s is None:
        size = float(MIN_UNIT_TOKENS)
    else:
        tail = remaining_tokens / (2 * max(1, n_workers))
        size = min(
            tokens_per_s * TARGET_UNIT_SECONDS,
            max(tokens_per_s * FLOOR_UNIT_SECONDS, tail),
        )
    return int(min(MAX_UNIT_TOKENS, max(MIN_UNIT_TOKENS, size)))


class UnitQueue:
    """Work units handed out on demand, the longest sequences first.

    :meth:`from_plan` cuts the plan's length-sorted batches (those of the in-process
    engine) into units as they are asked for, each of a given number of tokens or
    sized by :func:`next_unit_tokens`; :meth:`from_units` hands out ready units.
    """

    def __init__(
        self,
        plan: EmbedPlan | None,
        batches: list[list[int]],
        units: list[WorkUnit],
        unit_tokens: int | None,
    ) -> None:
        self._plan = plan
        self._batches = batches  # ascending length: popped from the end
        self._units = units
        self._unit_tokens = unit_tokens
        self._issued = 0
        self.n_seqs = len(plan.missing_hashes) if plan else sum(u.n_seqs for u in units)
        self.remaining_tokens = (
            sum(plan.missing_tokens) if plan else sum(u.n_tokens for u in units)
        )

    @classmethod
    def from_plan(
        cls,
        plan: EmbedPlan,
        *,
        rule: BatchRule,
        unit_tokens: int | None = None,
    ) -> UnitQueue:
        if unit_tokens is not None and unit_tokens < 1:
            msg = f"unit size must be a positive number of tokens, got {unit_tokens}"
            raise ValueError(msg)
        batches = plan_batches(plan.missing_tokens, rule)
        return cls(plan, batches, [], unit_tokens)

    @classmethod
    def from_units(cls, units: Sequence[WorkUnit]) -> UnitQueue:
        ordered = sorted(units, key=lambda u: max(u.tokens, default=0))
        return cls(None, [], ordered, None)

    def __bool__(self) -> bool:
        return bool(self._batches or self._units)

    def next_unit(self, *, tokens_per_s: float | None, n_workers: int) -> WorkUnit:
        """The next unit (the queue must not be empty)."""
        if self._units:
            unit = self._units.pop()
        else:
            assert self._plan is not None
            size = self._unit_tokens or next_unit_tokens(
                tokens_per_s, self.remaining_tokens, n_workers
            )
            taken: list[list[int]] = []
            n_tokens = 0
            while self._batches and n_tokens < size:
                batch = self._batches.pop()
                taken.append(batch)
                n_tokens += sum(self._plan.missing_tokens[i] for i in batch)
            unit = unit_of_batches(self._plan, taken, index=self._issued)
        self._issued += 1
        self.remaining_tokens -= unit.n_tokens
        return unit


# --- workers ------------------------------------------------------------------------


class EmbedcacheWorker(WorkerPlugin):
    """Per-worker-process state: the adapter (loaded once), open stores, a unit lock.

    Registered with ``Client.register_plugin``; the scheduler installs it on every
    worker, including those that join or restart later. It holds one adapter at a
    time, so a run over ten models does not keep ten models in memory.
    """

    name = PLUGIN_NAME
    idempotent = True  # a second run on the same cluster keeps the loaded adapter

    def __init__(self) -> None:
        self._worker: Worker | None = None
        self._lock: threading.Lock | None = None
        self._spec: AdapterSpec | None = None
        self._adapter: Adapter | None = None
        self._load_error: EmbedcacheError | None = None
        self._stores: dict[StoreRef, EmbeddingStore] = {}

    def setup(self, worker: Worker) -> None:
        self._worker = worker
        self._lock = threading.Lock()

    def teardown(self, worker: Worker) -> None:
        self._adapter = None
        self._stores.clear()

    @property
    def address(self) -> str:
        return self._worker.address if self._worker is not None else "a worker"

    def run(
        self,
        spec: AdapterSpec,
        ref: StoreRef,
        keys: tuple[ModelKey, ...],
        unit: WorkUnit,
    ) -> UnitResult:
        """Embed ``unit`` into the store, one unit at a time on this worker."""
        assert self._lock is not None, "the plugin was not set up on a worker"
        with self._lock:
            adapter = self._adapter_for(spec, keys)
            store = self._store_for(ref)
            torch = sys.modules.get("torch")
            if torch is not None and self._worker is not None:
                # Dask starts workers with OMP_NUM_THREADS=1; a unit runs alone here,
                # so it gets all of the worker's threads
                torch.set_num_threads(self._worker.state.nthreads)
            return run_unit(adapter, store, unit, skip_stored=True)

    def _adapter_for(self, spec: AdapterSpec, keys: tuple[ModelKey, ...]) -> Adapter:
        if spec != self._spec:
            self._spec, self._adapter, self._load_error = spec, None, None
            start = time.perf_counter()
            try:
                self._adapter = spec.load()
            except EmbedcacheError as err:
                err.add_note(f"while loading {spec.model} on worker {self.address}")
                self._load_error = err
            except Exception as err:  # noqa: BLE001 - any load failure repeats
                msg = (
                    f"worker {self.address} could not load {spec.model} "
                    f"(revision {spec.revision or 'default'}): {type(err).__name__}: {err}"
                )
                self._load_error = ClusterError(msg)
            else:
                logger.info(
                    "loaded %s on %s in %.1f s",
                    spec.model,
                    self.address,
                    time.perf_counter() - start,
                )
        if self._load_error is not None:
            raise self._load_error
        assert self._adapter is not None
        built = adapter_keys(self._adapter)
        if built != keys:
            msg = (
                f"worker {self.address} built {built[0].short()} for {spec.model}, but "
                f"the client planned {keys[0].short()} (key digests {built[0].digest[:12]} "
                f"vs {keys[0].digest[:12]}). Workers must run the same embedcache "
                "version and see the same model files as the client."
            )
            raise ClusterError(msg)
        return self._adapter

    def _store_for(self, ref: StoreRef) -> EmbeddingStore:
        store = self._stores.get(ref)
        if store is None:
            try:
                store = ref.open(create=False)
            except (OSError, EmbedcacheError) as err:
                msg = (
                    f"worker {self.address} cannot open the store {ref.location}: {err}. "
                    "The store must be reachable at the same location by every worker "
                    "(a shared filesystem mounted at the same path, or object storage)."
                )
                raise StoreError(msg) from err
            self._stores[ref] = store  # one writer per process: its shards auto-merge
        return store


def run_unit_task(
    spec: AdapterSpec, ref: StoreRef, keys: tuple[ModelKey, ...], unit: WorkUnit
) -> UnitResult | UnitFailure:
    """The Dask task: embed one unit on this worker and store it; return counts."""
    worker = get_worker()
    plugin = worker.plugins.get(PLUGIN_NAME)
    if not isinstance(plugin, EmbedcacheWorker):
        msg = (
            f"worker {worker.address} has no {PLUGIN_NAME} plugin; submit units "
            "through embedcache.engine.cluster.run_units, which registers it"
        )
        return UnitFailure(unit.index, worker.address, ClusterError(msg))
    try:
        return plugin.run(spec, ref, keys, unit)
    except EmbedcacheError as err:
        return UnitFailure(unit.index, worker.address, err)


# --- client -------------------------------------------------------------------------


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

    The same result as :func:`embedcache.engine.embed.embed_sequences` (vectors in input
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
        :data:`TARGET_UNIT_SECONDS` of a worker's measured rate
        (:func:`next_unit_tokens`).
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
    plan = plan_embedding(adapter, seqs, client_store, names=names)
    if plan.missing_hashes:
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
    record_alias(client_store, plan, alias)
    vectors = gather_vectors(client_store, plan, key, dim)
    return EmbedResult(
        vectors=vectors, n_computed=plan.n_computed, n_cached=plan.n_cached
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


# --- starting or reaching a cluster -------------------------------------------------


def parse_cluster(spec: str) -> tuple[str, int | str]:
    """``("local", N)`` for ``local:N``, ``("address", spec)`` for ``scheme://...``.

    Raises
    ------
    ClusterError
        The spec is neither.
    """
    text = spec.strip()
    if text.startswith("local:"):
        count = text.removeprefix("local:")
        if count.isdigit() and int(count) >= 1:
            return "local", int(count)
    elif "://" in text and text.split("://", 1)[1]:
        return "address", text
    msg = (
        f"cluster {spec!r} is neither local:N (N >= 1 worker processes started for "
        "this run) nor a Dask scheduler address such as tcp://HOST:8786"
    )
    raise ClusterError(msg)


def available_cores() -> int:
    """CPU cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@contextlib.contextmanager
def open_cluster(
    spec: str,
    *,
    threads_per_worker: int | None = None,
    timeout: float = 30.0,
) -> Iterator[Client]:
    """A client for ``spec`` (see :func:`parse_cluster`), closed on exit.

    ``local:N`` starts a LocalCluster of N worker processes with cores/N threads each
    (or ``threads_per_worker``) and shuts it down on exit; an address connects to a
    running scheduler and leaves its cluster running.

    Raises
    ------
    ClusterError
        Bad spec, unreachable scheduler, or ``threads_per_worker`` with an address
        (the workers' threads are set where they are started).
    """
    kind, value = parse_cluster(spec)
    if kind == "local":
        assert isinstance(value, int)
        threads = threads_per_worker or max(1, available_cores() // value)
        logger.info(
            "starting a local Dask cluster: %d workers x %d threads", value, threads
        )
        with (
            LocalCluster(
                n_workers=value,
                threads_per_worker=threads,
                processes=True,
                dashboard_address=":0",
            ) as cluster,
            Client(cluster) as client,
        ):
            yield client
        return
    if threads_per_worker is not None:
        msg = (
            f"--threads does not apply to the running cluster at {value}: its workers' "
            "threads are set where they are started (dask worker --nthreads)"
        )
        raise ClusterError(msg)
    try:
        client = Client(value, timeout=timeout)
    except (OSError, TimeoutError) as err:
        msg = (
            f"cannot reach a Dask scheduler at {value} within {timeout:.0f} s ({err}). "
            "Start one (`dask scheduler`, then `dask worker ADDRESS`) or check the address."
        )
        raise ClusterError(msg) from err
    with client:
        if not client.nthreads():
            logger.info("no workers at %s yet; units wait until one joins", value)
        yield client


__all__ = [
    "DEFAULT_RETRIES",
    "FLOOR_UNIT_SECONDS",
    "MAX_UNIT_TOKENS",
    "MIN_UNIT_TOKENS",
    "PLUGIN_NAME",
    "TARGET_UNIT_SECONDS",
    "AdapterSpec",
    "EmbedcacheWorker",
    "StoreRef",
    "UnitFailure",
    "UnitQueue",
    "available_cores",
    "embed_on_cluster",
    "next_unit_tokens",
    "open_cluster",
    "parse_cluster",
    "resolve_spec",
    "run_unit_task",
    "run_units",
    "store_ref",
]
