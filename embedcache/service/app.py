"""The FastAPI application: routes, error replies, and the state they share.

Handlers validate and hash (the engine's plan, in a worker thread), answer hits from
the store, and wait on the model's :class:`~embedcache.service.batcher.Batcher` for
the rest; a client that leaves has its queued work dropped.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from embedcache import __version__
from embedcache.errors import EmbedcacheError
from embedcache.hashing import normalise_sequence
from embedcache.service import wire
from embedcache.service.errors import (
    QueueFullError,
    RequestError,
    RequestTooLargeError,
    ServiceUnavailableError,
)
from embedcache.service.guards import Guard
from embedcache.service.lookup import plan_request, read_vectors
from embedcache.service.schemas import (
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbedRequest,
    EmbedResponse,
    Health,
    ModelList,
    error_responses,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    import numpy as np

    from embedcache.service.batcher import Batcher
    from embedcache.service.lookup import RequestPlan
    from embedcache.service.metrics import Metrics
    from embedcache.service.registry import ModelRegistry, ServedModel
    from embedcache.service.settings import ServeSettings
    from embedcache.store import EmbeddingStore

logger = logging.getLogger(__name__)


@dataclass
class ServiceState:
    """What the routes share: settings, models, store, queues, metrics, readiness."""

    settings: ServeSettings
    registry: ModelRegistry
    store: EmbeddingStore
    batchers: dict[str, Batcher]
    metrics: Metrics
    ready: bool = False
    draining: bool = False
    deadline: float | None = field(default=None)

    def begin_drain(self, *, timeout: float) -> None:
        """Stop taking work: not ready, queued work 503, the batch in flight finishes."""
        if self.draining:
            return
        logger.info(
            "draining: finishing the batches in flight (at most %.0f s)", timeout
        )
        self.draining = True
        self.ready = False
        self.deadline = time.monotonic() + timeout
        for batcher in self.batchers.values():
            batcher.stop()

    def join(self) -> None:
        """Wait for the batcher threads, until the drain deadline."""
        for batcher in self.batchers.values():
            batcher.stop()
            left = (
                None
                if self.deadline is None
                else max(self.deadline - time.monotonic(), 0.0)
            )
            if not batcher.join(left):
                logger.error(
                    "%s: a batch was still running at the drain deadline",
                    batcher.model.name,
                )


def create_app(state: ServiceState) -> Guard:
    """The ASGI application of a server: the routes behind the :class:`Guard`."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        for batcher in state.batchers.values():
            batcher.start()
        state.ready = True
        logger.info("ready: serving %s", state.registry.names)
        yield
        state.begin_drain(timeout=state.settings.graceful_timeout)
        await run_in_threadpool(state.join)

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
    )


def _error(
    status: int, message: str, *, index: int | None = None, headers: dict | None = None
) -> JSONResponse:
    return JSONResponse(
        wire.error_body(message, status=status, index=index),
        status_code=status,
        headers=headers,
    )


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestError)
    async def request_error(_: Request, err: RequestError) -> JSONResponse:
        headers = (
            {"Retry-After": str(err.retry_after)}
            if isinstance(err, QueueFullError)
            else None
        )
        return _error(err.status, str(err), index=err.index, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def malformed(_: Request, err: RequestValidationError) -> JSONResponse:
        message, index = _describe_validation(err.errors())
        return _error(400, message, index=index)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, err: StarletteHTTPException) -> JSONResponse:
        return _error(
            err.status_code, str(err.detail), headers=getattr(err, "headers", None)
        )

    @app.exception_handler(EmbedcacheError)
    async def embedcache_error(_: Request, err: EmbedcacheError) -> JSONResponse:
        logger.error("request failed: %s", err)
        return _error(500, f"the server could not answer: {err}")

    @app.exception_handler(Exception)
    async def unexpected(_: Request, err: Exception) -> JSONResponse:
        logger.exception("unexpected error")
        return _error(500, "internal error; the server log has the details")


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


def _add_routes(app: FastAPI, state: ServiceState) -> None:
    ERRORS = error_responses(400, 401, 404, 413, 422, 429, 500, 503)

    @app.get(wire.ROUTE_LIVE, response_model=Health, tags=["health"])
    async def live() -> dict:
        return {"status": "live"}

    @app.get(
        wire.ROUTE_READY,
        response_model=Health,
        responses=error_responses(503),
        tags=["health"],
    )
    async def ready() -> dict | JSONResponse:
        if state.ready and not state.draining:
            return {"status": "ready"}
        reason = "draining" if state.draining else "starting"
        return _error(503, f"not ready: {reason}")

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
        wire.ROUTE_EMBEDDINGS, response_model=EmbeddingsResponse, responses=ERRORS
    )
    async def embeddings(body: EmbeddingsRequest, request: Request) -> Response:
        served = state.registry.get(body.model)
        if body.dimensions is not None and body.dimensions != served.dim:
            msg = f"{served.name} gives {served.dim}-dimensional vectors; dimensions={body.dimensions} cannot be served"
            raise RequestError(msg)
        seqs = [body.input] if isinstance(body.input, str) else body.input
        vectors, _ = await _embed(state, served, seqs, request, field="input")
        n_tokens = await run_in_threadpool(_count_tokens, served, seqs)
        if body.encoding_format == "base64":
            items = [
                base64.b64encode(v.astype("<f4").tobytes()).decode() for v in vectors
            ]
        else:
            items = vectors.tolist()
        data = [
            {"object": "embedding", "index": i, "embedding": e}
            for i, e in enumerate(items)
        ]
        return _json(
            {
                "object": "list",
                "data": data,
                "model": served.name,
                "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
            }
        )

    @app.post(
        wire.ROUTE_EMBED,
        response_model=EmbedResponse,
        responses={
            **ERRORS,
            200: {"content": {wire.MEDIA_ARROW: {}, wire.MEDIA_NPY: {}}},
        },
    )
    async def embed(body: EmbedRequest, request: Request) -> Response:
        served = state.registry.get(body.model)
        vectors, planned = await _embed(
            state, served, body.sequences, request, field="sequences"
        )
        plan, cached = planned.plan, planned.cached
        n_computed, n_cached = plan.n_computed, plan.n_cached
        headers = {
            wire.HEADER_KEY_DIGEST: served.key.digest,
            wire.HEADER_COMPUTED: str(n_computed),
            wire.HEADER_CACHED: str(n_cached),
        }
        accept = request.headers.get("accept", "")
        if wire.MEDIA_ARROW in accept:
            meta = {
                wire.ARROW_META_KEY_DIGEST: served.key.digest.encode(),
                wire.ARROW_META_MODEL: served.name.encode(),
            }
            data = wire.encode_arrow(
                vectors, hashes=plan.hashes, cached=cached, metadata=meta
            )
            return Response(data, media_type=wire.MEDIA_ARROW, headers=headers)
        if wire.MEDIA_NPY in accept:
            return Response(
                wire.encode_npy(vectors), media_type=wire.MEDIA_NPY, headers=headers
            )
        rows = vectors.tolist()
        items = [
            {"index": i, "sha256": h, "cached": c, "embedding": e}
            for i, (h, c, e) in enumerate(zip(plan.hashes, cached, rows, strict=True))
        ]
        return _json(
            {
                "model": served.name,
                "key_digest": served.key.digest,
                "dim": served.dim,
                "n_computed": n_computed,
                "n_cached": n_cached,
                "data": items,
            },
            headers=headers,
        )


def _json(content: dict, *, headers: dict | None = None) -> Response:
    # plain json.dumps: no per-float validation pass over 10,000 x dim vectors
    body = json.dumps(content, separators=(",", ":"), allow_nan=False)
    return Response(body, media_type=wire.MEDIA_JSON, headers=headers)


async def _embed(
    state: ServiceState,
    served: ServedModel,
    seqs: list[str],
    request: Request,
    *,
    field: str,
) -> tuple[np.ndarray, RequestPlan]:
    """Plan, queue the misses, wait (dropping the work if the client leaves), read back."""
    if state.draining:
        msg = "the server is shutting down; retry against a running server"
        raise ServiceUnavailableError(msg)
    limit = state.settings.max_sequences
    if len(seqs) > limit:
        msg = f"{len(seqs)} sequences in one request; the limit is {limit}: split it"
        raise RequestTooLargeError(msg)
    planned = await run_in_threadpool(
        plan_request, served, seqs, state.store, field=field
    )
    plan = planned.plan
    metrics = state.metrics
    metrics.hits.labels(served.name).inc(plan.n_cached)
    metrics.misses.labels(served.name).inc(plan.n_computed)
    if plan.n_computed:
        batcher = state.batchers[served.name]
        ticket = batcher.submit(
            plan.missing_seqs, plan.missing_hashes, plan.missing_tokens.tolist()
        )
        done = asyncio.wrap_future(ticket.future)
        gone = asyncio.ensure_future(_disconnected(request))
        await asyncio.wait({done, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not done.done():
            batcher.cancel(ticket)
            msg = "the client disconnected"
            raise ServiceUnavailableError(msg)
        gone.cancel()
        done.result()
    vectors = await run_in_threadpool(read_vectors, served, state.store, plan)
    return vectors, planned


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _count_tokens(served: ServedModel, seqs: Sequence[str]) -> int:
    return sum(served.adapter.n_tokens(normalise_sequence(seq)) for seq in seqs)


__all__ = ["ServiceState", "create_app"]
