"""The FastAPI application: routes and error replies over the :class:`ServiceState`.

Handlers only route: parsing a body, the engine's plan, the store's reads and the
reply's encoding each run in a bounded worker thread (:class:`WorkerThreads`: past
its limit, 503 rather than more threads); a handler waits on
the model's :class:`~embedcache.service.batcher.Batcher` for the misses. A client
that leaves, or a request past its deadline (504), has its queued work dropped. A
request's error names only its own inputs; a server fault answers a generic 500 or
503 with the request id, and the log line with that id holds the error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any, TypeVar

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from embedcache import __version__
from embedcache.errors import EmbedcacheError, StoreError
from embedcache.hashing import normalise_sequence
from embedcache.service import replies, wire
from embedcache.service.errors import (
    RequestError,
    RequestTimeoutError,
    RequestTooLargeError,
    SequenceFailedError,
    ServerFaultError,
    ServiceUnavailableError,
    UnprocessableSequenceError,
)
from embedcache.service.guards import Guard, request_id
from embedcache.service.lookup import plan_request, read_vectors
from embedcache.service.schemas import (
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbedRequest,
    EmbedResponse,
    Health,
    ModelList,
    check_list_length,
    error_responses,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence

    import numpy as np
    from pydantic import BaseModel

    from embedcache.service.lookup import RequestPlan
    from embedcache.service.registry import ServedModel
    from embedcache.service.state import ServiceState
    from embedcache.service.workers import WorkerThreads

logger = logging.getLogger(__name__)
T = TypeVar("T")
M = TypeVar("M", bound="BaseModel")


async def _build(
    workers: WorkerThreads,
    func: Callable[..., T],
    *args: object,
    size: int,
    **kwargs: object,
) -> T:
    """A body parsed or a reply encoded: on the loop when small (``size`` bytes or
    floats), else in a worker thread."""
    if replies.is_small(size):
        return func(*args, **kwargs)
    return await workers.run(func, *args, **kwargs)


async def _encode(
    state: ServiceState,
    served: ServedModel,
    func: Callable[..., T],
    *args: object,
    size: int,
    **kwargs: object,
) -> T:
    """A reply's body built as :func:`_build` does, timed as the ``encode`` stage."""
    start = time.perf_counter()
    try:
        return await _build(state.workers, func, *args, size=size, **kwargs)
    finally:
        state.metrics.observe_stage(served.name, "encode", time.perf_counter() - start)


def create_app(state: ServiceState) -> Guard:
    """The ASGI application of a server: the routes behind the :class:`Guard`."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        for batcher in state.batchers.values():
            batcher.start()
        probing = None
        if state.probe is not None:
            await state.probe.check()
            probing = asyncio.ensure_future(state.probe.run())
        if not state.draining:  # a failed warm-up may have begun the drain
            state.ready = True
            logger.info("serving %s", state.registry.names)
        yield
        if probing is not None:
            probing.cancel()
        state.begin_drain(timeout=state.settings.graceful_timeout)
        await anyio.to_thread.run_sync(state.join)

    app = FastAPI(
        title="embedcache",
        version=__version__,
        summary="DNA language model embeddings, answered from a content-addressed store",
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
        strict_content_type=False,  # `curl -d` sends a form content type
    )
    _add_error_handlers(app)
    _add_routes(app, state)
    return Guard(
        app,
        metrics=state.metrics,
        routes=[
            wire.ROUTE_EMBEDDINGS,
            wire.ROUTE_EMBED,
            wire.ROUTE_MODELS,
            wire.ROUTE_LIVE,
            wire.ROUTE_READY,
            wire.ROUTE_METRICS,
            wire.ROUTE_OPENAPI,
        ],
        api_keys=state.settings.api_keys,
        max_body_bytes=state.settings.max_body_bytes,
        max_buffered_bytes=state.settings.max_buffered_bytes,
        limit_requests=state.settings.limit_concurrency,
    )


def _error(
    request: Request,
    status: int,
    message: str,
    *,
    headers: dict | None = None,
    **fields: Any,  # noqa: ANN401 (wire.error_body's: index, error_type)
) -> JSONResponse:
    rid = request_id(request.scope)
    body = wire.error_body(message, status=status, request_id=rid, **fields)
    return JSONResponse(body, status_code=status, headers=headers)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestError)
    async def request_error(request: Request, err: RequestError) -> JSONResponse:
        headers = None
        retry_after = getattr(err, "retry_after", None)
        if retry_after is not None:
            headers = {"Retry-After": str(retry_after)}
        elif err.status == 503:
            headers = {"Retry-After": "1"}
        if isinstance(err, ServerFaultError) and err.__cause__ is not None:
            # a store fault met on the request's own path (the queue logs its own)
            rid = request_id(request.scope)
            logger.error("request %s: %s: %s", rid, err, err.__cause__)
        return _error(
            request,
            err.status,
            str(err),
            index=err.index,
            headers=headers,
            error_type=err.error_type,
        )

    @app.exception_handler(RequestValidationError)
    async def malformed(request: Request, err: RequestValidationError) -> JSONResponse:
        message, index = _describe_validation(err.errors())
        return _error(request, 400, message, index=index)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        headers = getattr(err, "headers", None)
        return _error(request, err.status_code, str(err.detail), headers=headers)

    @app.exception_handler(Exception)
    async def fault(request: Request, err: Exception) -> JSONResponse:
        # the message may name a bucket path or another request's sequence: it goes
        # to the log line only, under the request id the reply carries
        rid = request_id(request.scope)
        if isinstance(err, StoreError | OSError):
            logger.error("request %s: the store failed: %s", rid, err)
            message = "the store did not answer; retry later"
            return _error(request, 503, message, headers={"Retry-After": "1"})
        if isinstance(err, EmbedcacheError):
            logger.error("request %s failed: %s", rid, err)
        else:
            logger.error("request %s: unexpected error", rid, exc_info=err)
        return _error(request, 500, "internal error; the server log has the details")


def _describe_validation(errors: Sequence[dict[str, Any]]) -> tuple[str, int | None]:
    """A one-line message naming the first bad field, and a list index if any."""
    if not errors:
        return "malformed request body", None
    first = errors[0]
    loc = [part for part in first.get("loc", ()) if part != "body"]
    where = ".".join(str(part) for part in loc) or "body"
    index = next((part for part in loc if isinstance(part, int)), None)
    if first.get("type") == "json_invalid":
        return f"the body is not valid JSON: {first.get('msg')}", None
    if not loc:
        return (
            "the body must be a JSON object, sent with Content-Type: application/json",
            None,
        )
    return f"malformed request body at {where}: {first.get('msg')}", index


def _health_route(
    app: FastAPI, route: str, word: str, reason: Callable[[], str | None]
) -> None:
    """A health route: 200 ``{"status": word}``, or 503 saying why not."""

    async def health(request: Request) -> dict | JSONResponse:
        why = reason()
        if why is None:
            return {"status": word}
        return _error(request, 503, f"not {word}: {why}")

    app.get(
        route,
        name=word,
        response_model=Health,
        responses=error_responses(503),
        tags=["health"],
    )(health)


def _add_routes(app: FastAPI, state: ServiceState) -> None:
    ERRORS = error_responses(400, 401, 404, 413, 422, 429, 500, 503)

    _health_route(app, wire.ROUTE_LIVE, "live", state.liveness)
    _health_route(app, wire.ROUTE_READY, "ready", state.readiness)

    @app.get(
        wire.ROUTE_METRICS,
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}}, **error_responses(401)},
    )
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=state.metrics.content_type)

    @app.get(
        wire.ROUTE_MODELS, response_model=ModelList, responses=error_responses(401)
    )
    async def models() -> dict:
        s = state.settings
        return {
            "object": "list",
            "data": [model.info() for model in state.registry.models],
            "limits": {
                "max_body_bytes": s.max_body_bytes,
                "max_sequences": s.max_sequences,
                "max_queue_tokens": s.max_queue_tokens,
            },
        }

    @app.post(
        wire.ROUTE_EMBEDDINGS,
        response_model=EmbeddingsResponse,
        responses=ERRORS,
        openapi_extra=_body_schema(EmbeddingsRequest),
    )
    async def embeddings(request: Request) -> Response:
        async with _deadline(state):
            body, raw = await _parse(state, request, EmbeddingsRequest)
            served = state.registry.get(body.model)
            if body.dimensions is not None and body.dimensions != served.dim:
                msg = f"{served.name} gives {served.dim}-dimensional vectors; dimensions={body.dimensions} cannot be served"
                raise RequestError(msg)
            seqs = [body.input] if isinstance(body.input, str) else body.input
            vectors, _ = await _embed(state, served, seqs, request, field="input")
            n_tokens = await _build(
                state.workers, _count_tokens, served, seqs, size=len(raw)
            )
            data = await _encode(
                state,
                served,
                replies.embeddings_body,
                vectors,
                size=vectors.size,
                model=served.name,
                n_tokens=n_tokens,
                encoding_format=body.encoding_format,
            )
        return Response(data, media_type=wire.MEDIA_JSON)

    @app.post(
        wire.ROUTE_EMBED,
        response_model=EmbedResponse,
        responses={
            **ERRORS,
            200: {"content": {wire.MEDIA_ARROW: {}, wire.MEDIA_NPY: {}}},
        },
        openapi_extra=_body_schema(EmbedRequest),
    )
    async def embed(request: Request) -> Response:
        async with _deadline(state):
            body, _ = await _parse(state, request, EmbedRequest)
            served = state.registry.get(body.model)
            vectors, planned = await _embed(
                state, served, body.sequences, request, field="sequences"
            )
            plan, cached = planned.plan, planned.cached
            headers = {
                wire.HEADER_KEY_DIGEST: served.key.digest,
                wire.HEADER_COMPUTED: str(plan.n_computed),
                wire.HEADER_CACHED: str(plan.n_cached),
            }
            meta = {
                wire.ARROW_META_KEY_DIGEST: served.key.digest.encode(),
                wire.ARROW_META_MODEL: served.name.encode(),
            }
            accept = request.headers.get("accept", "")
            binary = await _encode(
                state,
                served,
                replies.embed_binary,
                vectors,
                accept,
                size=vectors.size,
                hashes=plan.hashes,
                cached=cached,
                metadata=meta,
            )
            if binary is not None:
                data, media = binary
                return Response(data, media_type=media, headers=headers)
            head = {
                "model": served.name,
                "key_digest": served.key.digest,
                "dim": served.dim,
                "n_computed": plan.n_computed,
                "n_cached": plan.n_cached,
            }
            data = await _encode(
                state,
                served,
                replies.embed_body,
                vectors,
                size=vectors.size,
                head=head,
                hashes=plan.hashes,
                cached=cached,
            )
        return Response(data, media_type=wire.MEDIA_JSON, headers=headers)


async def _parse(
    state: ServiceState, request: Request, model: type[M]
) -> tuple[M, bytes]:
    """The request's body read, its sequences counted before it is parsed (413
    early), and parsed as ``model`` (off the loop when large)."""
    raw = await request.body()
    field = "input" if model is EmbeddingsRequest else "sequences"
    check_list_length(raw, field=field, limit=state.settings.max_sequences)
    body = await _build(state.workers, replies.parse_body, model, raw, size=len(raw))
    return body, raw


def _body_schema(model: type) -> dict:
    """The OpenAPI request body of a route that parses its body itself."""
    schema = model.model_json_schema()
    return {
        "requestBody": {
            "required": True,
            "content": {wire.MEDIA_JSON: {"schema": schema}},
        }
    }


@contextlib.asynccontextmanager
async def _deadline(state: ServiceState) -> AsyncIterator[None]:
    """The request's deadline: past it, 504 (the queued work is dropped by _embed)."""
    seconds = state.settings.request_timeout
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        msg = f"the request took longer than the server's limit of {seconds:g} s; retry, or split it"
        raise RequestTimeoutError(msg) from None


async def _embed(
    state: ServiceState,
    served: ServedModel,
    seqs: list[str],
    request: Request,
    *,
    field: str,
) -> tuple[np.ndarray, RequestPlan]:
    """Plan, queue the misses, wait (dropping the work if the client leaves or the
    deadline passes), read back."""
    if state.draining:
        msg = "the server is shutting down; retry against a running server"
        raise ServiceUnavailableError(msg)
    limit = state.settings.max_sequences
    if len(seqs) > limit:
        msg = f"{len(seqs)} sequences in one request; the limit is {limit}: split it"
        raise RequestTooLargeError(msg)
    start = time.perf_counter()
    planned = await state.workers.run(
        plan_request, served, seqs, state.store, field=field
    )
    state.metrics.observe_stage(served.name, "tokenise", time.perf_counter() - start)
    plan = planned.plan
    metrics = state.metrics
    metrics.hits.labels(served.name).inc(plan.n_cached)
    metrics.misses.labels(served.name).inc(plan.n_computed)
    if plan.n_computed:
        batcher = state.batchers[served.name]
        if not batcher.alive:
            msg = (
                f"the queue of {served.name!r} stopped; retry against a running server"
            )
            raise ServiceUnavailableError(msg)
        ticket = batcher.submit(
            plan.missing_seqs,
            plan.missing_hashes,
            plan.missing_tokens.tolist(),
            request_id=request_id(request.scope),
        )
        done = asyncio.wrap_future(ticket.future)
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({done, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not done.done():  # the client left, or the deadline passed
                batcher.cancel(ticket)
        if not done.done():
            msg = "the client disconnected"
            raise ServiceUnavailableError(msg)
        try:
            done.result()
        except SequenceFailedError as err:
            raise _name_failed(err, plan.hashes, seqs, field) from None
    if planned.vectors is not None:  # hits only: read with the plan
        return planned.vectors, planned
    vectors = await state.workers.run(read_vectors, served, state.store, plan)
    return vectors, planned


def _name_failed(
    err: SequenceFailedError, hashes: Sequence[str], seqs: Sequence[str], field: str
) -> UnprocessableSequenceError:
    """The failed sequence named by this request's own index and length."""
    index = hashes.index(err.digest)
    msg = (
        f"{field}[{index}] (length {len(seqs[index])}) could not be embedded: {err}; "
        "the server log has the details"
    )
    return UnprocessableSequenceError(msg, index=index)


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _count_tokens(served: ServedModel, seqs: Sequence[str]) -> int:
    return sum(served.adapter.n_tokens(normalise_sequence(seq)) for seq in seqs)


__all__ = ["create_app"]
