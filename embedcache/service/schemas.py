"""The JSON bodies of the routes as pydantic models: validation and the OpenAPI schema,
and :func:`check_list_length`, which counts a body's sequences before it is parsed."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from embedcache.service.errors import RequestTooLargeError


def _not_empty(value: object) -> object:
    # an empty request is a client's mistake (400), not an empty answer; checked
    # before the type so the one message names it (not each type of a union)
    if isinstance(value, list) and not value:
        msg = "an empty list; give at least one sequence"
        raise ValueError(msg)
    return value


NotEmpty = BeforeValidator(_not_empty)


class EmbeddingsRequest(BaseModel):
    """OpenAI's embeddings request; ``user`` is accepted and ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str
    input: Annotated[str | list[str], NotEmpty]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


class EmbeddingItem(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingItem]
    model: str
    usage: Usage


class EmbedRequest(BaseModel):
    """The native request: sequences of one model."""

    model_config = ConfigDict(extra="forbid")

    model: str
    sequences: Annotated[list[str], NotEmpty]


class EmbedItem(BaseModel):
    index: int
    sha256: str = Field(description="sha256 of the upper-cased sequence: its store key")
    cached: bool = Field(description="whether the store held it when the request came")
    embedding: list[float]


class EmbedResponse(BaseModel):
    model: str
    key_digest: str
    dim: int
    n_computed: int
    n_cached: int
    data: list[EmbedItem]


class ModelInfo(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    key_digest: str = Field(
        description="the store key's digest: equal on every replica"
    )
    dtype: str = Field(description="the resolved compute dtype the key records")
    key: dict[str, Any]
    dim: int
    family: str
    max_tokens: int | None
    options: dict[str, Any]


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelInfo]
    limits: dict[str, int]


class Health(BaseModel):
    status: str


class ErrorDetail(BaseModel):
    message: str
    type: str
    index: int | None = None
    request_id: str | None = Field(
        default=None, description="the id the server log names this request by"
    )


class ErrorBody(BaseModel):
    error: ErrorDetail


# a JSON string (escapes included) or a bracket: all the scan needs to see
_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
_QUOTE, _OPEN_LIST, _OPEN_OBJECT = ord('"'), ord("["), ord("{")
# strings a valid body holds besides its sequences: keys, model, encoding_format ...
_OTHER_STRINGS = 16


def check_list_length(body: bytes, *, field: str, limit: int) -> None:
    """Refuse a body whose top-level ``field`` list holds more than ``limit`` items,
    counting them in its bytes before it is parsed: a 16 MiB body of one-letter
    sequences would be 1.5 M Python strings before a count after parsing said 413.

    Stops as soon as the count passes the limit. A body with fewer quotes than a
    list of ``limit + 1`` strings needs (almost every request) is not scanned; one
    with far more JSON values than such a list (elsewhere in the body) is refused
    too.

    Raises
    ------
    RequestTooLargeError
        The list, or the body's JSON values, pass the limit (answered 413).
    """
    if body.count(b'"') <= 2 * (limit + _OTHER_STRINGS):
        return
    key = json.dumps(field).encode()
    max_tokens = 2 * (limit + _OTHER_STRINGS) + 64
    depth, n_items, counting, last = 0, 0, False, (0, 0)
    for n_tokens, match in enumerate(_TOKENS.finditer(body)):
        start = match.start()
        first = body[start]
        if first == _QUOTE:
            if depth == 1:  # a key, or a string value, of the body's object
                last = (start, match.end())
            elif counting and depth == 2:
                n_items += 1
                if n_items > limit:
                    msg = (
                        f"more than {limit} sequences in one request ({field}); "
                        f"the limit is {limit}: split it"
                    )
                    raise RequestTooLargeError(msg)
        elif first in (_OPEN_LIST, _OPEN_OBJECT):
            depth += 1
            if depth == 2:  # a list right after a string at depth 1: its key
                counting = first == _OPEN_LIST and body[slice(*last)] == key
        else:
            depth -= 1
            counting = counting and depth >= 2
        if n_tokens > max_tokens:
            msg = (
                f"the body holds more JSON values than a request of {limit} "
                "sequences (the limit) does: split it"
            )
            raise RequestTooLargeError(msg)


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` entry documenting these error statuses with the error body."""
    return {status: {"model": ErrorBody} for status in statuses}


__all__ = [
    "EmbedRequest",
    "EmbedResponse",
    "EmbeddingsRequest",
    "EmbeddingsResponse",
    "ErrorBody",
    "Health",
    "ModelList",
    "check_list_length",
    "error_responses",
]
