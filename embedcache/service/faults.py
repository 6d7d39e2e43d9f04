"""Who is at fault, decided at the boundary that knows.

Every call the service makes into the store goes through :class:`StoreBoundary`, so
whatever the store layer raises (an obstore ``PermissionDeniedError`` of expired
credentials as much as a ``StoreUnavailableError``) is a store fault, never the
sequences': 503 with ``Retry-After`` when it can pass, 500 ``store_corrupt`` when it
cannot (:class:`~embedcache.errors.CorruptStoreError`, logged for the operator:
the store itself sets a run that fails its checks aside on read, so what reaches
here is damage it could not, such as a key's group document; ``embedcache store
verify`` names it and ``store repair`` drops broken runs). What the forward pass raises is the model backend's unless a
known-good canary batch passes on the same model (see
:mod:`embedcache.service.breaker`). A device error CUDA cannot recover from is
fatal: the process exits so the orchestrator restarts it.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any

from embedcache.errors import CorruptStoreError
from embedcache.service.errors import (
    ServerFaultError,
    StoreCorruptError,
    StoreFaultError,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from embedcache.store import EmbeddingStore

logger = logging.getLogger(__name__)

# CUDA's sticky errors: the context is lost, every later call fails the same way,
# and only a new process recovers (out-of-memory is not one of them)
FATAL_DEVICE_ERRORS = (
    "an illegal memory access",
    "device-side assert",
    "unspecified launch failure",
    "misaligned address",
    "illegal instruction",
    "uncorrectable ECC error",
)

STORE_UNAVAILABLE = "the store did not answer; retry later"
STORE_CORRUPT = (
    "the store holds data that fails its checks; retrying will not help, "
    "the operator has been told (the server log has the details)"
)


def is_fatal_device_error(err: BaseException) -> bool:
    """Whether ``err`` (or an error it chains) is a device error only a restart
    recovers from."""
    seen: BaseException | None = err
    while seen is not None:
        text = str(seen)
        if any(marker in text for marker in FATAL_DEVICE_ERRORS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def store_fault(err: Exception, store: EmbeddingStore) -> ServerFaultError:
    """The reply to a store-layer error: 500 ``store_corrupt`` when retrying cannot
    help (logged for the operator), else 503.

    A run that fails its checks never gets here: the store's reads skip it
    (quarantined: its rows read as absent and are computed again, counted in
    ``store.n_quarantined``), so a corrupt error here is damage no run explains.
    """
    if isinstance(err, CorruptStoreError):
        logger.error(
            "the store %s holds damage reads cannot skip (run `embedcache store "
            "verify`, then `store repair`): %s",
            getattr(store, "root", "?"),
            err,
        )
        return StoreCorruptError(STORE_CORRUPT)
    return StoreFaultError(STORE_UNAVAILABLE)


class StoreBoundary:
    """``store`` with every method call's error turned into a store fault
    (:class:`~embedcache.service.errors.StoreFaultError` or
    :class:`~embedcache.service.errors.StoreCorruptError`, the cause chained)."""

    def __init__(self, store: EmbeddingStore) -> None:
        self._store = store

    @property
    def inner(self) -> EmbeddingStore:
        return self._store

    def __getattr__(self, name: str) -> Any:  # noqa: ANN401 (the store's own)
        value = getattr(self._store, name)
        if not callable(value):
            return value
        return self._guard(value)

    def _guard(self, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def call(*args: object, **kwargs: object) -> Any:  # noqa: ANN401
            try:
                return method(*args, **kwargs)
            except ServerFaultError:
                raise
            except Exception as err:
                raise store_fault(err, self._store) from err

        return call


def guarded(store: EmbeddingStore | StoreBoundary) -> StoreBoundary:
    """``store`` behind a :class:`StoreBoundary` (once)."""
    return store if isinstance(store, StoreBoundary) else StoreBoundary(store)


__all__ = [
    "FATAL_DEVICE_ERRORS",
    "StoreBoundary",
    "guarded",
    "is_fatal_device_error",
    "store_fault",
]
