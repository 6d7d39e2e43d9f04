"""The one embedding call every front end makes: these sequences, this model, this store.

:func:`embed_into_store` resolves the model and its options, opens the store when
given a location, and runs the missing sequences in this process or on a Dask
cluster. :func:`embed_file` and :func:`embed_version` read their sequences first
(a sequence file; a version's drawn items) and then make that call. The command
line calls these and only prints; a server or a notebook calls the same.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from embedcache.engine.output import npy_rows, write_npy
from embedcache.errors import AdapterOptionError, ClusterError, InputFileError
from embedcache.models.options import LAST_LAYER, EmbedOptions
from embedcache.models.registry import parse_layers

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from distributed import Client

    from embedcache.data.seqfile import SequenceRecords
    from embedcache.data.subsets import Subset
    from embedcache.data.versions import VersionSpec
    from embedcache.engine.plan import EmbedResult
    from embedcache.models.base import Adapter
    from embedcache.specs import ModelKey
    from embedcache.store import EmbeddingStore

logger = logging.getLogger(__name__)


def wants_cluster(cluster: str | Client | None) -> bool:
    """Whether ``cluster`` sends the work to Dask: a client, or a spec other than
    None, ``""`` or ``"none"`` (see :func:`~embedcache.engine.dask_setup.parse_cluster`).
    """
    if isinstance(cluster, str):
        return bool(cluster) and cluster.strip().lower() != "none"
    return cluster is not None


def embed_options(
    model: str,
    options: EmbedOptions | Mapping[str, Any] | None = None,
    *,
    revision: str | None = None,
) -> EmbedOptions:
    """The options record from a record or its fields, as a front end gives them.

    Among the fields, ``layers`` may be a spec (``"all"``, ``"2,6,12"``) and
    ``layer`` one layer, as ``--layers`` and ``--layer`` give them; ``all`` reads
    ``model``'s layer count (:func:`~embedcache.models.registry.parse_layers`).

    Raises
    ------
    AdapterOptionError
        A field is unknown or invalid, or the layers do not parse.
    """
    if isinstance(options, EmbedOptions):
        return options
    fields = dict(options or {})
    layers = fields.pop("layers", None)
    layer = int(fields.pop("layer", LAST_LAYER))
    if layers is None or isinstance(layers, str):
        layers = parse_layers(layers, layer=layer, model=model, revision=revision)
    elif layer != LAST_LAYER:
        msg = "give --layer or --layers, not both"
        raise AdapterOptionError(msg)
    try:
        return EmbedOptions(layers=tuple(layers), **fields)
    except TypeError as err:
        msg = f"{model}: {err}"
        raise AdapterOptionError(msg) from err


def embed_into_store(
    model: str,
    seqs: Sequence[str],
    store: EmbeddingStore | str | os.PathLike[str],
    *,
    revision: str | None = None,
    options: EmbedOptions | Mapping[str, Any] | None = None,
    names: Sequence[str] | None = None,
    token_budget: int | None = None,
    cluster: str | Client | None = None,
    unit_tokens: int | None = None,
    threads: int | None = None,
    store_options: Mapping[str, str] | None = None,
    progress: bool = False,
) -> EmbedResult:
    """Embed ``seqs`` with ``model`` into ``store``; compute only what it lacks.

    Parameters
    ----------
    model
        Built-in name, local model directory or hub id.
    store
        An open store, or its location (a folder or an s3://, gs://, az:// URL),
        opened (created if absent) with ``store_options``.
    options
        :class:`EmbedOptions` or its fields (see :func:`embed_options`).
    names
        Item names for error messages, one per sequence.
    token_budget
        Padded tokens per forward pass (None: the model's preferred budget).
    cluster
        None or ``"none"``: in this process. ``"local:N"`` starts N Dask worker
        processes for this call, ``"tcp://HOST:PORT"`` uses a running scheduler, and
        a ``distributed.Client`` is used as it is.
    unit_tokens
        On a cluster, sequence tokens per work unit (None: sized to the rate).
    threads
        Torch CPU threads in this process; with ``local:N``, threads per worker.
    progress
        Show a progress bar.

    Returns
    -------
    EmbedResult
        Vectors in input order, what was computed and found, the keys filled.

    Raises
    ------
    InvalidSequenceError, SequenceTooLongError
        Found before anything runs; the store is unchanged.
    AdapterOptionError, UnknownModelError
        The model or an option is wrong.
    ClusterError
        The cluster cannot be reached, ``threads`` is given for a running cluster,
        or a unit failed on it.
    """
    opts = embed_options(model, options, revision=revision)
    if wants_cluster(cluster):
        return _embed_on_dask(
            model,
            seqs,
            store,
            cluster=cluster,
            revision=revision,
            options=opts,
            names=names,
            token_budget=token_budget,
            unit_tokens=unit_tokens,
            threads=threads,
            store_options=store_options,
            progress=progress,
        )
    from embedcache.engine.local import embed_sequences

    adapter = _local_adapter(model, opts, revision=revision, threads=threads)
    return embed_sequences(
        adapter,
        seqs,
        _open_store(store, store_options),
        names=names,
        token_budget=token_budget,
        progress=progress,
    )


def _local_adapter(
    model: str, opts: EmbedOptions, *, revision: str | None, threads: int | None
) -> Adapter:
    """The adapter of an in-process run, with this process set up for it."""
    from embedcache.engine.memory import keep_freed_memory, return_freed_memory
    from embedcache.models import load_adapter

    if threads:
        import torch

        torch.set_num_threads(threads)
    adapter = load_adapter(model, revision=revision, **opts.to_dict())
    if "torch" in sys.modules:
        # a network's activations above glibc's mmap threshold were faulted in afresh
        # every layer
        keep_freed_memory()
    else:
        # the k-mer floors run millions of sequences through few, cheap passes:
        # memory is the limit there, so freed temporaries go back at once
        return_freed_memory()
    return adapter


def _open_store(
    store: EmbeddingStore | str | os.PathLike[str],
    options: Mapping[str, str] | None,
) -> EmbeddingStore:
    from embedcache.store import EmbeddingStore

    if isinstance(store, EmbeddingStore):
        return store
    return EmbeddingStore(store, options=options)


def _embed_on_dask(
    model: str,
    seqs: Sequence[str],
    store: EmbeddingStore | str | os.PathLike[str],
    *,
    cluster: str | Client,
    threads: int | None,
    **kwargs: Any,  # noqa: ANN401 - embed_on_cluster's options
) -> EmbedResult:
    from embedcache.engine.cluster import embed_on_cluster
    from embedcache.engine.dask_setup import open_cluster

    if not isinstance(cluster, str):
        if threads is not None:
            msg = (
                "threads do not apply to a running cluster: its workers' threads are "
                "set where they are started (dask worker --nthreads)"
            )
            raise ClusterError(msg)
        return embed_on_cluster(cluster, model, seqs, store, **kwargs)
    with open_cluster(cluster, threads_per_worker=threads) as client:
        return embed_on_cluster(client, model, seqs, store, **kwargs)


def embed_file(
    path: Path | str,
    model: str,
    store: EmbeddingStore | str | os.PathLike[str],
    *,
    output: Path | str | None = None,
    **kwargs: Any,  # noqa: ANN401 - embed_into_store's options
) -> EmbedResult:
    """Embed every sequence of a file (one a line, FASTA, or a TSV with ``seq``).

    Error messages name items as the reader does (``line 3``, ``record 'a' (line
    1)``). With ``output``, the vectors are written there as a float32 (n, d)
    ``.npy`` in input order, atomically. Other options are those of
    :func:`embed_into_store`.

    In this process, a file of more than one chunk
    (:data:`~embedcache.data.seqfile.STREAM_ROWS` rows) streams: it is read through
    once to refuse a bad item before anything is computed (each character, and each
    length the model cannot take whole), then embedded a chunk at a time, each
    chunk's vectors going straight to ``output``. Memory is then bounded by a chunk
    and the batch, not the file: the result's vectors are the written file, mapped
    (without ``output``, an array in memory). Counts are as for one call: a
    sequence computed in an earlier chunk is cached in a later one. On a Dask
    cluster the file is read whole.

    Raises
    ------
    InputFileError
        The file cannot be read or holds no sequence.
    """
    from embedcache.data.seqfile import iter_records

    if wants_cluster(kwargs.get("cluster")):
        from embedcache.data.seqfile import read_sequences

        records = read_sequences(Path(path))
        chunks: list[SequenceRecords] = [records]
    else:
        chunks = list(itertools.islice(iter_records(Path(path)), 2))
    if len(chunks) == 1:  # the whole file is in hand
        result = embed_into_store(
            model, chunks[0].seqs, store, names=chunks[0].names, **kwargs
        )
        if output is not None:
            write_npy(output, np.asarray(result.vectors, dtype=np.float32))
        return result
    del chunks
    return _embed_file_streamed(Path(path), model, store, output=output, **kwargs)


def _embed_file_streamed(
    path: Path,
    model: str,
    store: EmbeddingStore | str | os.PathLike[str],
    *,
    output: Path | str | None,
    revision: str | None = None,
    options: EmbedOptions | Mapping[str, Any] | None = None,
    token_budget: int | None = None,
    threads: int | None = None,
    store_options: Mapping[str, str] | None = None,
    progress: bool = False,
    # a cluster's options, none here (embed_file sent a cluster run elsewhere)
    cluster: object = None,
    unit_tokens: int | None = None,
) -> EmbedResult:
    """:func:`embed_file` of a file of several chunks, in this process."""
    from embedcache.data.seqfile import iter_records
    from embedcache.engine.local import embed_sequences
    from embedcache.engine.plan import EmbedResult, refuse_too_long

    opts = embed_options(model, options, revision=revision)
    adapter = _local_adapter(model, opts, revision=revision, threads=threads)
    n = 0
    for chunk in iter_records(path):  # the reader checks each character
        refuse_too_long(adapter, chunk.seqs, chunk.names)
        n += len(chunk)
    logger.info("%s: %d sequences, embedded a chunk at a time", path, n)
    store = _open_store(store, store_options)  # the file is good: now it may change
    with npy_rows(output, (n, adapter.dim)) as out:
        computed = 0
        keys: tuple[ModelKey, ...] = ()
        for chunk in iter_records(path):
            if out.done + len(chunk) > n:
                break
            part = embed_sequences(
                adapter,
                chunk.seqs,
                store,
                names=chunk.names,
                token_budget=token_budget,
                progress=progress,
            )
            out.write(part.vectors)
            computed += part.n_computed
            keys = part.keys
        if out.done != n:
            msg = f"{path} changed while it was embedded ({n} rows, then {out.done}+)"
            raise InputFileError(msg)
    return EmbedResult(
        vectors=out.result(), n_computed=computed, n_cached=n - computed, keys=keys
    )


def embed_version(
    version: VersionSpec | str | os.PathLike[str],
    model: str,
    store: EmbeddingStore | str | os.PathLike[str],
    *,
    data_dir: Path | None = None,
    with_rc: bool = False,
    **kwargs: Any,  # noqa: ANN401 - embed_into_store's options
) -> tuple[Subset, EmbedResult]:
    """Draw a version (a shipped name, a ``.toml`` or a spec) and embed all its items.

    Train and test items alike, named by item id in error messages. With
    ``with_rc``, the reverse complements of the test items follow (named
    ``<item_id>:rc``), stored like any sequence, for the report's ``accuracy_rc``.
    Other options are those of :func:`embed_into_store`.

    Returns
    -------
    tuple
        The drawn subset and the result, rows in the subset's item order (then,
        with ``with_rc``, the test items' reverse complements in that order).
    """
    from embedcache.data.subsets import draw_version
    from embedcache.data.versions import VersionSpec, load_version

    spec = version if isinstance(version, VersionSpec) else load_version(version)
    subset = draw_version(spec, data_dir=data_dir)
    items = subset.items
    seqs, names = items["seq"].to_list(), items["item_id"].to_list()
    if with_rc:
        from embedcache.hashing import reverse_complement

        test = items.filter(items["split"] == "test")
        seqs += [reverse_complement(s) for s in test["seq"].to_list()]
        names += [f"{i}:rc" for i in test["item_id"].to_list()]
    result = embed_into_store(model, seqs, store, names=names, **kwargs)
    return subset, result


__all__ = [
    "embed_file",
    "embed_into_store",
    "embed_options",
    "embed_version",
    "wants_cluster",
    "write_npy",
]
