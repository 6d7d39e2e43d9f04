"""The errors a request can meet, each carrying the HTTP status it is answered with."""

from __future__ import annotations

from embedcache.errors import EmbedcacheError


class RequestError(EmbedcacheError, ValueError):
    """A request the service refuses; ``status`` is its HTTP status, ``index`` the
    offending sequence's position when one is to blame."""

    status = 400

    def __init__(self, message: str, *, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


class MalformedRequestError(RequestError):
    status = 400


class UnauthorizedError(RequestError):
    status = 401


class ServedModelNotFoundError(RequestError, LookupError):
    status = 404


class RequestTooLargeError(RequestError):
    status = 413


class UnprocessableSequenceError(RequestError):
    status = 422


class QueueFullError(RequestError):
    """The model's queue is over its token limit: retry after ``retry_after`` s."""

    status = 429

    def __init__(self, message: str, *, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ServiceUnavailableError(RequestError):
    """The server is draining (or not ready): retry against a running one."""

    status = 503


class ServeConfigError(EmbedcacheError, ValueError):
    """The server cannot start as configured (options, serve.toml, key file, bind)."""


__all__ = [
    "MalformedRequestError",
    "QueueFullError",
    "RequestError",
    "RequestTooLargeError",
    "ServeConfigError",
    "ServedModelNotFoundError",
    "ServiceUnavailableError",
    "UnauthorizedError",
    "UnprocessableSequenceError",
]
