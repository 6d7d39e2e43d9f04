"""Starting or reaching a Dask cluster: ``local:N`` or a scheduler address."""

from __future__ import annotations

import contextlib
import logging
import os
from typing import TYPE_CHECKING

from distributed import Client, LocalCluster

from embedcache.errors import ClusterError

if TYPE_CHECKING:
    from collections.abc import Iterator

logger = logging.getLogger(__name__)


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


__all__ = ["available_cores", "open_cluster", "parse_cluster"]
