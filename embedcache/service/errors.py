"""The errors a request can meet, each carrying the HTTP status it is answered with.

Who is at fault decides the status (docs/serving-faults.md has the table): the
input (4xx: what validation proves, or a sequence that fails alone while a canary
batch passes), the store (503 and retry; 500 ``store_corrupt``: do not), or the
model's backend (424, as TEI answers).
"""

from __future__ import annotations

from embedcache.errors import EmbedcacheError


class RequestError(EmbedcacheError, ValueError):
    """A request the service refuses; ``status`` is its HTTP status, ``index`` the
    offending sequence's position when one is to blame."""

    status = 400
    error_type: str | None = None  # the reply's "type" when the status alone is not it

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
    """The server is draining (or not ready, or at its limit of worker threads):
    retry after ``retry_after`` s, here or against another replica."""

    status = 503

    def __init__(self, message: str, *, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RequestTimeoutError(RequestError):
    """The request's deadline (``request_timeout``) passed before it was answered;
    its queued work is dropped."""

    status = 504


class ServerFaultError(RequestError):
    """The server failed on this request for a reason not in its inputs (500), or a
    backend it needs is down (``status`` 503): the message is generic, the log line
    with the same request id holds the details."""

    status = 500

    def __init__(self, message: str, *, status: int = 500) -> None:
        super().__init__(message)
        self.status = status


class StoreFaultError(ServerFaultError):
    """The store failed (down, refusing credentials, full): the message is generic;
    it can pass, so 503 and ``Retry-After``."""

    def __init__(self, message: str, *, retry_after: int = 1) -> None:
        super().__init__(message, status=503)
        self.retry_after = retry_after


class StoreCorruptError(ServerFaultError):
    """What the store holds fails its checks: 500 ``store_corrupt``; retrying will
    not help (an operator runs `embedcache store verify` and `store repair`)."""

    error_type = "store_corrupt"

    def __init__(self, message: str) -> None:
        super().__init__(message, status=500)


class BackendFaultError(ServerFaultError):
    """The model's backend failed on a pass a known-good canary batch fails too (a
    device fault): 424, as TEI answers; nobody's sequence is blamed."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=424)


class SequenceFailedError(RequestError):
    """The model failed on one sequence alone while a known-good canary batch passed
    on it (the rest of its pass was computed without it): ``digest`` names it, so
    each request can name it by its own index."""

    status = 422

    def __init__(self, digest: str, kind: str) -> None:
        super().__init__(f"the model failed on this sequence alone ({kind})")
        self.digest = digest
        self.kind = kind


class ServeConfigError(EmbedcacheError, ValueError):
    """The server cannot start as configured (options, serve.toml, key file, bind)."""


__all__ = [
    "BackendFaultError",
    "MalformedRequestError",
    "QueueFullError",
    "RequestError",
    "RequestTimeoutError",
    "RequestTooLargeError",
    "SequenceFailedError",
    "ServeConfigError",
    "ServedModelNotFoundError",
    "ServerFaultError",
    "ServiceUnavailableError",
    "StoreCorruptError",
    "StoreFaultError",
    "UnauthorizedError",
    "UnprocessableSequenceError",
]
