"""The JSON bodies of the routes as pydantic models: validation and the OpenAPI schema."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class EmbeddingsRequest(BaseModel):
    """OpenAI's embeddings request; ``user`` is accepted and ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str
    input: str | list[str]
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
    sequences: list[str]


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
    key_digest: str
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
    "error_responses",
]
