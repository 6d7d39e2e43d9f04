"""The bodies of the embedding routes, built in a worker thread (never on the loop).

A 10,000 x 256 JSON reply is ~50 MB of text: built on the event loop it would hold
every other request, a cached one-sequence request too, for as long. orjson writes
numpy rows directly; rows go out as float64, so the numbers are exactly those
``json.dumps(vectors.tolist())`` wrote before (the float32 values, shortest repr).
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import orjson
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from embedcache.service import wire

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from pydantic import BaseModel

_OPTIONS = orjson.OPT_SERIALIZE_NUMPY
# rows a JSON encoding call: ~1 ms of orjson at 256-d, so a thread encoding 10,000
# rows hands the GIL to the event loop's thread between blocks
BLOCK = 64
# values (body bytes, reply floats) up to which the loop's thread does it itself
SMALL = 16_384
M = TypeVar("M", bound="BaseModel")


def parse_body(model: type[M], body: bytes) -> M:
    """``body`` validated as ``model`` (any content type is read as JSON).

    Raises
    ------
    RequestValidationError
        The body is not JSON or not the model; answered 400 naming the field.
    """
    try:
        return model.model_validate_json(body or b"null")
    except ValidationError as err:
        raise RequestValidationError(err.errors(include_url=False)) from None


def dumps(content: object) -> bytes:
    """Compact JSON; numpy arrays as lists."""
    return orjson.dumps(content, option=_OPTIONS)


def is_small(n_values: int) -> bool:
    """Whether a body or reply this size is cheaper built on the loop than handed to
    a worker thread (a thread hop costs more than ~1 ms of encoding)."""
    return n_values <= SMALL


def _rows(vectors: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(vectors, dtype=np.float64)


def _with_data(head: dict[str, object], rows: Sequence[bytes]) -> bytes:
    """``head`` with ``"data": [rows...]`` last, each row already JSON."""
    return dumps(head)[:-1] + b',"data":[' + b",".join(rows) + b"]}"


def _blocks(n: int, make: Callable[[int, int], list[dict]]) -> list[bytes]:
    """The items of rows [0, n) as JSON, :data:`BLOCK` rows a call: orjson holds the
    GIL through a call, so the loop's thread gets a turn between blocks."""
    return [
        dumps(make(start, min(start + BLOCK, n)))[1:-1] for start in range(0, n, BLOCK)
    ]


def embeddings_body(
    vectors: np.ndarray, *, model: str, n_tokens: int, encoding_format: str
) -> bytes:
    """OpenAI's embeddings reply: float lists, or base64 little-endian float32."""
    if encoding_format == "base64":
        items: Sequence[object] = [
            base64.b64encode(v.astype("<f4").tobytes()).decode() for v in vectors
        ]
    else:
        items = _rows(vectors)
    usage = {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    head = {"object": "list", "model": model, "usage": usage}
    return _with_data(
        head,
        _blocks(
            len(items),
            lambda a, b: [
                {"object": "embedding", "index": i, "embedding": items[i]}
                for i in range(a, b)
            ],
        ),
    )


def embed_body(
    vectors: np.ndarray,
    *,
    head: dict[str, object],
    hashes: Sequence[str],
    cached: Sequence[bool],
) -> bytes:
    """The native JSON reply: ``head`` (model, key digest, counts) and the rows."""
    rows = _rows(vectors)
    return _with_data(
        head,
        _blocks(
            len(rows),
            lambda a, b: [
                {
                    "index": i,
                    "sha256": hashes[i],
                    "cached": cached[i],
                    "embedding": rows[i],
                }
                for i in range(a, b)
            ],
        ),
    )


def embed_binary(
    vectors: np.ndarray,
    accept: str,
    *,
    hashes: Sequence[str],
    cached: Sequence[bool],
    metadata: dict[bytes, bytes],
) -> tuple[bytes, str] | None:
    """The Arrow or NPY reply ``accept`` asks for, with its media type; None for JSON."""
    if wire.MEDIA_ARROW in accept:
        data = wire.encode_arrow(
            vectors, hashes=list(hashes), cached=list(cached), metadata=metadata
        )
        return data, wire.MEDIA_ARROW
    if wire.MEDIA_NPY in accept:
        return wire.encode_npy(vectors), wire.MEDIA_NPY
    return None


__all__ = [
    "dumps",
    "embed_binary",
    "embed_body",
    "embeddings_body",
    "is_small",
    "parse_body",
]
