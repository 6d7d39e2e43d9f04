"""Transient object-store faults: retry what obstore does not, name what still fails.

obstore retries 5xx answers, refused and dropped connections and timeouts itself
(:data:`RETRY_CONFIG`), but not a conditional create whose connection broke, nor a
body cut off after its headers arrived. Those are retried here, a few times with
backoff; an operation that still fails raises one :class:`StoreUnavailableError`
naming the store, the operation and the object. A full disk is never retried: it
raises :class:`StoreFullError` at once.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import re
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from obstore.exceptions import GenericError
from zarr.storage import WrapperStore

from embedcache.errors import StoreFullError, StoreUnavailableError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

logger = logging.getLogger(__name__)

T = TypeVar("T")

# obstore's own retries (per request): 5xx, connection errors, dropped connections,
# timeouts of safe requests; exponential backoff with jitter, 0.1 s doubling to 5 s,
# at most 10 retries and 2 minutes
RETRY_CONFIG: dict[str, Any] = {
    "max_retries": 10,
    "retry_timeout": timedelta(seconds=120),
    "backoff": {
        "init_backoff": timedelta(milliseconds=100),
        "max_backoff": timedelta(seconds=5),
        "base": 2,
    },
}
# the HTTP client's timeouts (a stalled request is cut and retried)
CLIENT_DEFAULTS = {"connect_timeout": "5s", "timeout": "60s"}
# options that tune the retries, in seconds (or a count): store options override them
RETRY_KEYS = frozenset({"max_retries", "retry_timeout", "init_backoff", "max_backoff"})
# our own attempts at an operation obstore did not retry, and the first pause
ATTEMPTS = 4
FIRST_PAUSE_S = 0.2

_RETRIES = re.compile(r"after (\d+) retries, max_retries: (\d+)")


def retry_config(options: Mapping[str, str]) -> dict[str, Any]:
    """obstore's retry configuration, with any of :data:`RETRY_KEYS` from options."""
    config = {**RETRY_CONFIG, "backoff": dict(RETRY_CONFIG["backoff"])}
    for name, value in options.items():
        try:
            if name == "max_retries":
                config["max_retries"] = int(value)
            elif name == "retry_timeout":
                config["retry_timeout"] = timedelta(seconds=float(value))
            else:
                config["backoff"][name] = timedelta(seconds=float(value))
        except ValueError as err:
            msg = f"store option {name}={value!r} is not a number ({err})"
            raise ValueError(msg) from err
    return config


def no_space(err: BaseException) -> bool:
    """Whether ``err`` is a full disk (ENOSPC), as the OS or obstore reports it."""
    if isinstance(err, OSError) and err.errno == errno.ENOSPC:
        return True
    return isinstance(err, GenericError) and "No space left on device" in str(err)


def transient(err: BaseException) -> bool:
    """Whether another attempt may succeed: a network fault obstore did not retry."""
    if not isinstance(err, GenericError) or no_space(err):
        return False
    # obstore used up its own retries: the store is down, not flaky
    spent = _RETRIES.search(str(err))
    return spent is None or int(spent[1]) < int(spent[2])


def full_error(
    location: str, op: str, where: str, err: BaseException
) -> StoreFullError:
    msg = (
        f"no space left on device while {op} {where} (store {location}). Earlier "
        "commits are intact and the unfinished run is not part of the store; free "
        "space and run again: only the missing vectors are computed."
    )
    out = StoreFullError(msg)
    out.__cause__ = err
    return out


def unavailable_error(
    location: str, op: str, where: str, err: BaseException, attempts: int
) -> StoreUnavailableError:
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    msg = (
        f"the object store {location} failed while {op} {where}, after {attempts} "
        f"attempt(s): {first}. Nothing half-written is visible (commits are atomic); "
        "run again when the store answers: only the missing vectors are computed."
    )
    out = StoreUnavailableError(msg)
    out.__cause__ = err
    return out


def attempt(
    fn: Callable[[], T],
    *,
    location: str,
    op: str,
    where: str | Callable[[], str],
    on_retry: Callable[[BaseException], None] | None = None,
) -> T:
    """``fn()``, retried after transient faults; clear errors for the rest.

    ``op`` and ``where`` complete "while <op> <where>" in messages (e.g. "reading",
    a path; a callable is called only for a message). ``on_retry`` runs before
    each new attempt (with the error seen).
    """
    pause = FIRST_PAUSE_S
    for n in range(1, ATTEMPTS + 1):
        try:
            return fn()
        except (GenericError, OSError) as err:
            if callable(where):
                where = where()
            if not _check_retry(
                err, n, location=location, op=op, where=where, pause=pause
            ):
                raise
            if on_retry is not None:
                on_retry(err)
            time.sleep(pause)
            pause *= 2
    raise AssertionError  # unreachable: the last attempt returns or raises


async def attempt_async(
    fn: Callable[[], Awaitable[T]], *, location: str, op: str, where: str
) -> T:
    """:func:`attempt` for zarr's coroutines."""
    pause = FIRST_PAUSE_S
    for n in range(1, ATTEMPTS + 1):
        try:
            return await fn()
        except (GenericError, OSError) as err:
            if not _check_retry(
                err, n, location=location, op=op, where=where, pause=pause
            ):
                raise
            await asyncio.sleep(pause)
            pause *= 2
    raise AssertionError  # unreachable: the last attempt returns or raises


def _check_retry(
    err: Exception, n: int, *, location: str, op: str, where: str, pause: float
) -> bool:
    """True if attempt ``n`` may be followed by another; False if ``err`` is to be
    re-raised as it is (a missing object, say); else raise the error named.

    The caller re-raises with a bare ``raise``: ``raise err`` here would tie the
    error to this frame, a cycle that keeps the whole calling stack (and its
    arrays: a look-up's hashes) alive until the garbage collector runs.
    """
    if no_space(err):
        raise full_error(location, op, where, err) from err
    if not isinstance(err, GenericError):
        return False
    if n == ATTEMPTS or not transient(err):
        raise unavailable_error(location, op, where, err, n) from err
    logger.warning(
        "%s %s failed (%s); retrying in %.1f s",
        op,
        where,
        str(err).splitlines()[0],
        pause,
    )
    return True


class RetryingStore(WrapperStore):
    """A zarr store whose chunk reads and writes go through :func:`attempt_async`.

    Parameters
    ----------
    store
        zarr's ObjectStore over the backend's obstore store.
    describe
        The printable location of a path (for messages).
    location
        The store's root, as messages name it.
    """

    def __init__(
        self,
        store: Any,  # noqa: ANN401 (a zarr store)
        *,
        describe: Callable[[str], str],
        location: str,
    ) -> None:
        super().__init__(store)
        self._describe = describe
        self._location = location

    async def get(
        self,
        key: str,
        prototype: Any,  # noqa: ANN401
        byte_range: Any = None,  # noqa: ANN401
    ) -> Any:  # noqa: ANN401
        return await attempt_async(
            lambda: self._store.get(key, prototype, byte_range),
            location=self._location,
            op="reading",
            where=self._describe(key),
        )

    async def get_partial_values(
        self,
        prototype: Any,  # noqa: ANN401
        key_ranges: Any,  # noqa: ANN401
    ) -> Any:  # noqa: ANN401
        key_ranges = list(key_ranges)
        where = self._describe(key_ranges[0][0]) if key_ranges else self._location
        return await attempt_async(
            lambda: self._store.get_partial_values(prototype, key_ranges),
            location=self._location,
            op="reading",
            where=where,
        )

    async def set(self, key: str, value: Any) -> None:  # noqa: ANN401
        # a new run's chunk: writing it again is harmless
        await attempt_async(
            lambda: self._store.set(key, value),
            location=self._location,
            op="writing",
            where=self._describe(key),
        )


__all__ = [
    "CLIENT_DEFAULTS",
    "RETRY_CONFIG",
    "RETRY_KEYS",
    "RetryingStore",
    "attempt",
    "attempt_async",
    "no_space",
    "retry_config",
    "transient",
]
