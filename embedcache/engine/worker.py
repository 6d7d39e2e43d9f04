"""The worker side of the Dask path: what a task receives and how a worker runs it.

A task receives plain records (:class:`AdapterSpec`, :class:`StoreRef`, the keys and
a :class:`WorkUnit`). Each worker process loads the adapter once
(:class:`EmbedcacheWorker`, a Dask worker plugin) and runs one unit at a time with
torch using all the worker's threads. An error that would repeat on every attempt
(the model does not load, the store cannot be opened, a non-finite vector) is
returned by the task as a :class:`UnitFailure`, not raised, so the run fails once
with the worker's message instead of retrying.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distributed import get_worker
from distributed.diagnostics.plugin import WorkerPlugin

from embedcache.engine.forward import run_unit
from embedcache.engine.plan import adapter_keys
from embedcache.errors import ClusterError, EmbedcacheError, StoreError
from embedcache.models import (
    BUILTIN_MODELS,
    load_adapter,
    resolve_dtype,
    resolve_hub_model,
)
from embedcache.models.options import EmbedOptions
from embedcache.store import EmbeddingStore, is_url

if TYPE_CHECKING:
    from collections.abc import Mapping

    from distributed import Worker

    from embedcache.engine.plan import UnitResult, WorkUnit
    from embedcache.models.base import Adapter
    from embedcache.specs import ModelKey

logger = logging.getLogger(__name__)

PLUGIN_NAME = "embedcache-worker"


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
    hub id (resolved here, on the client), built-in names as they are; ``auto`` dtype
    as the client resolves it."""
    if options is None:
        options = EmbedOptions()
    elif not isinstance(options, EmbedOptions):
        options = EmbedOptions(**options)
    # --dtype auto once, here: every worker then computes the key the client plans
    dtype = resolve_dtype(options.dtype, options.device)
    options = dataclasses.replace(options, dtype=dtype)
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
            self._stores[ref] = store  # one writer per process: its runs auto-merge
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


__all__ = [
    "PLUGIN_NAME",
    "AdapterSpec",
    "EmbedcacheWorker",
    "StoreRef",
    "UnitFailure",
    "resolve_spec",
    "run_unit_task",
    "store_ref",
]
