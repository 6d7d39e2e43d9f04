"""What travels between the service and its clients: routes, formats, errors, limits.

Light on purpose (numpy and pyarrow are imported inside the functions that need
them, never FastAPI), so :mod:`embedcache.client` can share these names.
"""

from __future__ import annotations

import email.utils
import io
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

ROUTE_EMBEDDINGS = "/v1/embeddings"  # OpenAI-compatible
ROUTE_EMBED = "/v1/embed"  # native: JSON, Arrow or NPY
ROUTE_MODELS = "/v1/models"
ROUTE_LIVE = "/health/live"
ROUTE_READY = "/health/ready"
ROUTE_METRICS = "/metrics"
ROUTE_OPENAPI = "/openapi.json"

MEDIA_JSON = "application/json"
MEDIA_ARROW = "application/vnd.apache.arrow.stream"
MEDIA_NPY = "application/x-npy"

DEFAULT_MAX_BODY_BYTES = 16 * 2**20
DEFAULT_MAX_SEQUENCES = 10_000

# response headers of /v1/embed (also on binary replies, which carry no JSON)
HEADER_KEY_DIGEST = "X-Embedcache-Key-Digest"
HEADER_COMPUTED = "X-Embedcache-Computed"
HEADER_CACHED = "X-Embedcache-Cached"

# the Arrow reply's columns and schema metadata
ARROW_VECTOR = "embedding"  # fixed_size_list<float32>[dim]
ARROW_SHA256 = "sha256"
ARROW_CACHED = "cached"
ARROW_META_KEY_DIGEST = b"key_digest"
ARROW_META_MODEL = b"model"

# error types, one per HTTP status the service answers with on purpose
ERROR_TYPES = {
    400: "invalid_request",
    401: "authentication_error",
    404: "model_not_found",
    405: "method_not_allowed",
    413: "request_too_large",
    422: "invalid_sequence",
    424: "backend_error",  # the model failed, not the input (as TEI answers)
    429: "queue_full",
    500: "internal_error",
    503: "unavailable",
    504: "timeout",
}
# a 500 that retrying cannot fix: a stored chunk fails its checks (an operator's job)
ERROR_STORE_CORRUPT = "store_corrupt"
# every reply carries its request id; a server fault's log line names the same id
HEADER_REQUEST_ID = "X-Request-Id"


def error_body(
    message: str,
    *,
    status: int,
    index: int | None = None,
    request_id: str | None = None,
    error_type: str | None = None,
) -> dict:
    """``{"error": {"message", "type", "index"?, "request_id"?}}``: the body of every
    error reply; ``error_type`` when the status alone does not say it (a 500
    ``store_corrupt`` is not an ``internal_error``)."""
    error: dict[str, Any] = {
        "message": message,
        "type": error_type or ERROR_TYPES.get(status, "error"),
    }
    if index is not None:
        error["index"] = index
    if request_id is not None:
        error["request_id"] = request_id
    return {"error": error}


def encode_npy(vectors: np.ndarray) -> bytes:
    """Float32 (n, dim) as the bytes of a ``.npy`` file."""
    import numpy as np

    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(vectors, dtype=np.float32))
    return buffer.getvalue()


def decode_npy(data: bytes) -> np.ndarray:
    """The array of ``.npy`` bytes (never unpickles)."""
    import numpy as np

    return np.load(io.BytesIO(data), allow_pickle=False)


def encode_arrow(
    vectors: np.ndarray,
    *,
    hashes: list[str] | None = None,
    cached: list[bool] | None = None,
    metadata: dict[bytes, bytes] | None = None,
) -> bytes:
    """An Arrow IPC stream: a ``fixed_size_list<float32>[dim]`` column, one row a
    sequence, with its sha256 and whether it came from the store when given."""
    import numpy as np
    import pyarrow as pa

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    dim = vectors.shape[1]
    column = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), dim)
    arrays, names = [column], [ARROW_VECTOR]
    if hashes is not None:
        arrays.append(pa.array(hashes, type=pa.string()))
        names.append(ARROW_SHA256)
    if cached is not None:
        arrays.append(pa.array(cached, type=pa.bool_()))
        names.append(ARROW_CACHED)
    table = pa.Table.from_arrays(arrays, names=names).replace_schema_metadata(metadata)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def decode_arrow(data: bytes) -> np.ndarray:
    """Float32 (n, dim) from an Arrow IPC stream written by :func:`encode_arrow`."""
    import numpy as np
    import pyarrow as pa

    table = pa.ipc.open_stream(data).read_all()
    column = table.column(ARROW_VECTOR).combine_chunks()
    dim = column.type.list_size
    flat = column.flatten().to_numpy(zero_copy_only=False)
    return np.asarray(flat, dtype=np.float32).reshape(len(column), dim)


def decode_arrow_reply(data: bytes, digest: str) -> tuple[np.ndarray, np.ndarray, str]:
    """Vectors, per-row cached flags and the key digest of an Arrow ``/v1/embed`` reply
    (``digest`` when the reply's metadata names none)."""
    import numpy as np
    import pyarrow as pa

    table = pa.ipc.open_stream(data).read_all()
    cached = table.column(ARROW_CACHED).to_numpy(zero_copy_only=False)
    meta = table.schema.metadata or {}
    digest = meta.get(ARROW_META_KEY_DIGEST, digest.encode()).decode()
    return decode_arrow(data), np.asarray(cached, dtype=bool), digest


def retry_after_seconds(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta seconds or an HTTP date)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_SEQUENCES",
    "ERROR_STORE_CORRUPT",
    "HEADER_REQUEST_ID",
    "MEDIA_ARROW",
    "MEDIA_JSON",
    "MEDIA_NPY",
    "ROUTE_EMBED",
    "ROUTE_EMBEDDINGS",
    "ROUTE_LIVE",
    "ROUTE_METRICS",
    "ROUTE_MODELS",
    "ROUTE_OPENAPI",
    "ROUTE_READY",
    "decode_arrow",
    "decode_arrow_reply",
    "decode_npy",
    "encode_arrow",
    "encode_npy",
    "error_body",
    "retry_after_seconds",
]
