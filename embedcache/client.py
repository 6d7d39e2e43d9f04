"""The Python client of ``embedcache serve``: vectors in input order, sent in binary.

``EmbedClient(url, api_key=None)`` talks to one server. ``models()`` lists what it
serves; ``embed(seqs, model=...)`` returns float32 ``(n, dim)`` rows in input order.
Sequences are checked and hashed here first with the package's own rule, so a bad one
is named by its input index before anything is sent; each distinct sequence is sent
once. The distinct sequences are cut into requests within the server's limits (a 413
halves a request) and a few are kept in flight so the server's batcher stays fed.
429, 503 and 424 (the server's model or device failed; behind a balancer the next try
may reach another replica) are retried with jittered exponential backoff, or after the
server's ``Retry-After`` plus up to half as long again (jitter, so clients refused
together do not return together), and so is a dropped connection (embedding is
idempotent: a repeat is a store hit). A 500 ``store_corrupt`` is not: retrying cannot
mend stored data.

:func:`embed_file_on_server` and :func:`embed_version_on_server` are what
``embedcache embed --server`` and ``embedcache embeddings --server`` call.

Imports stay light: httpx and numpy (pyarrow only if Arrow is asked for).
"""

from __future__ import annotations

import functools
import logging
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

import httpx
import numpy as np

from embedcache.data.seqfile import validate_sequence
from embedcache.errors import (
    EmbedcacheError,
    InvalidSequenceError,
    SequenceTooLongError,
    UnknownModelError,
)
from embedcache.hashing import sequence_key
from embedcache.service import wire

if TYPE_CHECKING:
    import os
    import ssl
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from embedcache.data.subsets import Subset

logger = logging.getLogger(__name__)

# well inside the server's defaults (10,000 sequences, 16 MiB): a request's
# vectors come back in one piece and a busy server interleaves other clients
DEFAULT_MAX_SEQUENCES = 1_000
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
# busy (429), unavailable (503: draining, a store outage, the breaker open) and a
# backend fault (424): each may pass later or on another replica
RETRY_STATUSES = frozenset({424, 429, 503})
CONNECTION_RETRIES = 3


class ServiceError(EmbedcacheError, RuntimeError):
    """The embedding service refused a request, failed, or could not be reached."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        error_type: str | None = None,
        index: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.index = index


class ServiceAuthError(ServiceError, PermissionError):
    """The service wants an API key (401) or refused the one given."""


@dataclass(frozen=True)
class ServedEmbeddings:
    """What a server answered for a list of sequences, rows in input order.

    ``cached`` is True where the server found the vector in its store; a sequence
    repeated in the input is sent once and shares its first row's flag.
    """

    model: str
    key_digest: str
    vectors: np.ndarray
    hashes: list[str]
    cached: np.ndarray

    @property
    def n_computed(self) -> int:
        """Distinct sequences the server ran through the model for this call."""
        return len({h for h, c in zip(self.hashes, self.cached, strict=True) if not c})

    @property
    def n_cached(self) -> int:
        """Every other input row (in the store, or a repeat of a computed one)."""
        return len(self.hashes) - self.n_computed


@dataclass
class _Job:
    """One ``embed`` call's distinct sequences and where each sits in the input."""

    model: str
    arrow: bool
    label: Callable[[int], str]
    seqs: list[str] = field(default_factory=list)
    input_index: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class _Reply:
    key_digest: str
    vectors: np.ndarray
    cached: np.ndarray | None


class EmbedClient:
    """A client of one ``embedcache serve``.

    Parameters
    ----------
    url
        The server's base URL, e.g. ``http://127.0.0.1:8000``.
    api_key
        Sent as ``Authorization: Bearer KEY`` when the server wants keys.
    timeout
        Seconds a request may take (computing a large request can take minutes).
    max_retries
        Attempts after the first, per request, on 424, 429, 503 or a dropped
        connection.
    max_sequences, max_body_bytes
        Upper bounds of one request (defaults well inside the server's).
    concurrency
        Requests in flight at once for one ``embed`` call.
    transfer
        ``"npy"`` (the default) or ``"arrow"`` for :meth:`embed`'s wire format.
    backoff, max_backoff
        First and longest wait in seconds between retries (a server's
        ``Retry-After``, capped at ``max_backoff``, wins, with up to half as long
        again of jitter).
    transport
        An httpx transport to send through instead of the network (tests).
    """

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        *,
        timeout: float = 600.0,
        max_retries: int = 8,
        max_sequences: int = DEFAULT_MAX_SEQUENCES,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        concurrency: int = 2,
        transfer: str = "npy",
        backoff: float = 0.25,
        max_backoff: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if transfer not in ("npy", "arrow") or min(max_sequences, concurrency) < 1:
            msg = "transfer is 'npy' or 'arrow'; max_sequences, concurrency >= 1"
            raise ValueError(msg)
        self.url = url.rstrip("/")
        self.max_retries = max_retries
        self.max_sequences = max_sequences
        self.max_body_bytes = max_body_bytes
        self.concurrency = concurrency
        self.transfer = transfer
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._rng = random.Random()
        headers = {"User-Agent": "embedcache-client"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._http = httpx.Client(
            base_url=self.url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=10.0),
            limits=httpx.Limits(max_connections=max(concurrency, 4)),
            transport=transport,
            verify=_tls_context(),
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    # --- routes ----------------------------------------------------------------------

    def models(self) -> list[dict[str, Any]]:
        """The served models: name, key digest, key JSON, dim, family, options."""
        response = self._send("GET", wire.ROUTE_MODELS)
        body = response.json()
        return list(body.get("data", body) if isinstance(body, dict) else body)

    def embed(self, seqs: Sequence[str], *, model: str) -> np.ndarray:
        """Float32 ``(n, dim)`` vectors of ``seqs``, rows in input order (sent as NPY).

        Raises
        ------
        InvalidSequenceError
            A sequence is empty or holds a character outside A/C/G/T/N (named by
            its input index; nothing is sent).
        SequenceTooLongError
            The server's model cannot take a sequence (named by its input index).
        UnknownModelError
            The server does not serve ``model`` (the message lists what it serves).
        ServiceError
            Anything else the server refused, or it stayed busy or unreachable.
        """
        arrow = self.transfer == "arrow"
        return self._embed(seqs, model=model, names=None, arrow=arrow).vectors

    def embed_items(
        self,
        seqs: Sequence[str],
        *,
        model: str,
        names: Sequence[str] | None = None,
    ) -> ServedEmbeddings:
        """Like :meth:`embed`, with each row's sha256, whether the server had it
        stored, and the key digest (sent as Arrow). ``names`` label items in error
        messages."""
        return self._embed(seqs, model=model, names=names, arrow=True)

    def _embed(
        self,
        seqs: Sequence[str],
        *,
        model: str,
        names: Sequence[str] | None,
        arrow: bool,
    ) -> ServedEmbeddings:
        if isinstance(seqs, str):
            msg = "seqs must be a list of sequences, not one string; wrap it: [seq]"
            raise TypeError(msg)
        label = _labeller(list(names) if names is not None else None)
        hashes: list[str] = []
        first: dict[str, int] = {}  # sha256 -> its row among the distinct sequences
        job = _Job(model=model, arrow=arrow, label=label)
        for i, seq in enumerate(seqs):
            clean = validate_sequence(seq, label(i))
            digest = sequence_key(clean)
            hashes.append(digest)
            if digest not in first:
                first[digest] = len(job.seqs)
                job.seqs.append(clean)
                job.input_index.append(i)
        if not job.seqs:
            msg = "no sequences to embed: give at least one"
            raise InvalidSequenceError(msg)
        replies = self._post_all(job)
        rows = np.fromiter(
            (first[h] for h in hashes), dtype=np.int64, count=len(hashes)
        )
        vectors = np.concatenate([r.vectors for r in replies])[rows]
        cached = np.zeros(len(hashes), dtype=bool)
        if arrow:
            cached = np.concatenate([r.cached for r in replies])[rows]
        return ServedEmbeddings(
            model=model,
            key_digest=replies[0].key_digest,
            vectors=np.ascontiguousarray(vectors, dtype=np.float32),
            hashes=hashes,
            cached=cached,
        )

    # --- requests --------------------------------------------------------------------

    def _chunks(self, seqs: Sequence[str]) -> list[tuple[int, int]]:
        """(start, stop) ranges of ``seqs`` within the count and body limits."""
        out, start, size = [], 0, 0
        for i, seq in enumerate(seqs):
            cost = len(seq) + 4  # quotes, comma, space of the JSON list
            if i > start and (
                i - start >= self.max_sequences or size + cost > self.max_body_bytes
            ):
                out.append((start, i))
                start, size = i, 0
            size += cost
        out.append((start, len(seqs)))
        return out

    def _post_all(self, job: _Job) -> list[_Reply]:
        """Every chunk of ``job``, ``concurrency`` at a time, replies in order."""
        chunks = self._chunks(job.seqs)
        if len(chunks) == 1 or self.concurrency == 1:
            results = [self._post_split(job, *c) for c in chunks]
        else:
            with ThreadPoolExecutor(min(self.concurrency, len(chunks))) as pool:
                results = list(pool.map(lambda c: self._post_split(job, *c), chunks))
        return [reply for replies in results for reply in replies]

    def _post_split(self, job: _Job, start: int, stop: int) -> list[_Reply]:
        """One request for ``job.seqs[start:stop]``; halved and re-sent on a 413."""
        try:
            return [
                self._post_embed(job.seqs[start:stop], model=job.model, arrow=job.arrow)
            ]
        except ServiceError as err:
            if err.status == 413 and stop - start > 1:
                mid = (start + stop) // 2
                logger.info("request of %d sequences too large; halving", stop - start)
                return [
                    *self._post_split(job, start, mid),
                    *self._post_split(job, mid, stop),
                ]
            if err.index is not None and 0 <= err.index < stop - start:
                where = job.input_index[start + err.index]
                raise _at_input(err, job.label(where)) from err
            raise

    def _post_embed(self, seqs: list[str], *, model: str, arrow: bool) -> _Reply:
        """One request: NPY when only vectors are wanted, Arrow for the flags too."""
        response = self._send(
            "POST",
            wire.ROUTE_EMBED,
            json={"model": model, "sequences": seqs},
            headers={"Accept": wire.MEDIA_ARROW if arrow else wire.MEDIA_NPY},
        )
        digest = response.headers.get(wire.HEADER_KEY_DIGEST, "")
        if arrow:
            vectors, cached, digest = wire.decode_arrow_reply(response.content, digest)
        else:
            vectors, cached = wire.decode_npy(response.content), None
        if vectors.ndim != 2 or vectors.shape[0] != len(seqs):
            msg = (
                f"{self.url} answered {vectors.shape} vectors for {len(seqs)} "
                "sequences; is it an embedcache server of this version?"
            )
            raise ServiceError(msg, status=response.status_code)
        return _Reply(digest, vectors.astype(np.float32, copy=False), cached)

    def _send(self, method: str, route: str, **kwargs: Any) -> httpx.Response:  # noqa: ANN401
        """One call with retries on 424, 429, 503 and dropped connections.

        A busy server is waited for up to ``max_retries`` times; a connection that
        fails only ``CONNECTION_RETRIES`` times (a restart, not a wrong URL).
        """
        busy = dropped = 0
        while True:
            try:
                response = self._http.request(method, route, **kwargs)
            except httpx.TransportError as err:
                dropped += 1
                if dropped > min(self.max_retries, CONNECTION_RETRIES):
                    msg = (
                        f"{method} {self.url}{route}: {err!r} after {dropped} "
                        f"attempts; is the server running at {self.url}?"
                    )
                    raise ServiceError(msg) from err
                wait = self._backoff(dropped - 1)
                logger.warning("%s %s: %r; retry in %.2f s", method, route, err, wait)
                time.sleep(wait)
                continue
            status = response.status_code
            if status < 400:
                return response
            busy += 1
            if status not in RETRY_STATUSES or busy > self.max_retries:
                raise _error_of(response, method, route, attempts=busy)
            asked = wire.retry_after_seconds(response.headers.get("Retry-After"))
            if asked is None:
                wait = self._backoff(busy - 1)
            else:
                # never sooner than asked (up to max_backoff), spread over half as
                # long again: clients refused together do not return together
                wait = min(asked, self.max_backoff) * self._rng.uniform(1.0, 1.5)
            logger.info("%s %s: %d; retry in %.2f s", method, route, status, wait)
            time.sleep(wait)

    def _backoff(self, attempt: int) -> float:
        # full jitter: clients that were refused together do not return together
        return self._rng.uniform(0.5, 1.0) * min(
            self.max_backoff, self.backoff * 2**attempt
        )


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """httpx's default TLS context, made once a process: making one loads every CA
    certificate (~60 ms holding the GIL), which a client a thread paid each time."""
    return httpx.create_ssl_context()


def _labeller(names: list[str] | None) -> Callable[[int], str]:
    if names is None:
        return lambda i: f"sequence {i}"
    return lambda i: f"{names[i]} (sequence {i})"


def _error_of(
    response: httpx.Response, method: str, route: str, *, attempts: int
) -> ServiceError | UnknownModelError:
    """The error a refused request raises, with the server's own message."""
    status = response.status_code
    try:
        error = response.json()["error"]
        message, kind, index = error["message"], error.get("type"), error.get("index")
    except (ValueError, KeyError, TypeError):
        message, kind, index = response.text[:500], None, None
    where = f"{method} {response.request.url}"
    if status == 404 and kind == wire.ERROR_TYPES[404]:
        return UnknownModelError(f"{where}: {message}")
    if status == 401:
        msg = f"{where}: {message} (pass api_key=, or set EMBEDCACHE_API_KEY)"
        return ServiceAuthError(msg, status=status, error_type=kind)
    if status in RETRY_STATUSES:
        message += f" (still {status} after {attempts} attempts)"
    msg = f"{where}: {status} {message}"
    return ServiceError(msg, status=status, error_type=kind, index=index)


def _at_input(err: ServiceError, label: str) -> SequenceTooLongError:
    """A 422 about one sequence of a request, named as the input names it.

    Characters were checked here before sending, so what the server refuses is
    the sequence's length for its model.
    """
    msg = f"{label}: {err} (the server's index counts within one request)"
    return SequenceTooLongError(msg)


# --- the command line's calls -----------------------------------------------------------


def embed_file_on_server(
    path: Path | str,
    model: str,
    *,
    server: str,
    api_key: str | None = None,
    output: Path | str | None = None,
) -> ServedEmbeddings:
    """Embed every sequence of a file through a server; write ``output`` (.npy).

    The file is read as :func:`embedcache.engine.api.embed_file` reads it, and
    errors name items the same way.
    """
    from pathlib import Path

    from embedcache.data.seqfile import read_sequences
    from embedcache.engine.output import write_npy

    records = read_sequences(Path(path))
    with EmbedClient(server, api_key) as client:
        result = client.embed_items(records.seqs, model=model, names=records.names)
    if output is not None:
        write_npy(output, result.vectors)
    return result


def embed_version_on_server(
    version: str | os.PathLike[str],
    model: str,
    *,
    server: str,
    api_key: str | None = None,
    data_dir: Path | None = None,
) -> tuple[Subset, ServedEmbeddings]:
    """Draw a version and embed all its items through a server into its store."""
    from embedcache.data.subsets import draw_version
    from embedcache.data.versions import load_version

    subset = draw_version(load_version(version), data_dir=data_dir)
    items = subset.items
    with EmbedClient(server, api_key) as client:
        result = client.embed_items(
            items["seq"].to_list(), model=model, names=items["item_id"].to_list()
        )
    return subset, result


__all__ = [
    "EmbedClient",
    "ServedEmbeddings",
    "ServiceAuthError",
    "ServiceError",
    "embed_file_on_server",
    "embed_version_on_server",
]
