"""Frozen records that identify things: a model key names everything that changes a vector."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields
from typing import Any

KEY_SCHEMA = 1  # bump when a field is added to ModelKey, so old digests are not misread


@dataclass(frozen=True, slots=True)
class ModelKey:
    """Everything that changes an embedding vector.

    Two keys with any field different never share vectors in the store.
    """

    model_id: str
    revision: str  # hub commit sha, "sha256:<hex>" of a local dir's files, or built-in version
    adapter: str  # adapter family, e.g. "hf-encoder", "kmer", "caduceus"
    adapter_version: str
    layer: int = -1
    pooling: str = "mean"
    special_tokens: str = (
        "exclude"  # "exclude" | "include" | "none" (no special tokens added)
    )
    rc_mode: str = "none"  # "none" | "average"
    dtype: str = "float32"  # compute dtype; vectors are always stored as float32
    max_length: int | None = None  # tokens; None = unlimited
    truncation: str = "error"  # "error" | "right"
    options: tuple[tuple[str, str], ...] = ()  # adapter-specific, sorted by name

    def __post_init__(self) -> None:
        if self.revision in {"", "main", "master"}:
            msg = (
                f"model key for {self.model_id!r} has revision {self.revision!r}; "
                "a key needs a resolved commit hash or content digest"
            )
            raise ValueError(msg)
        object.__setattr__(self, "options", tuple(sorted(self.options)))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["options"] = [list(pair) for pair in self.options]
        data["key_schema"] = KEY_SCHEMA
        return data

    def canonical_json(self) -> str:
        """Sorted keys, no whitespace: the same key always gives the same bytes."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @property
    def digest(self) -> str:
        """sha256 hex of the canonical JSON; the store's name for this key."""
        return hashlib.sha256(self.canonical_json().encode("utf-8")).hexdigest()

    @classmethod
    def from_json(cls, text: str) -> ModelKey:
        data = json.loads(text)
        schema = data.pop("key_schema", None)
        if schema != KEY_SCHEMA:
            msg = f"model key written with key_schema={schema}, this embedcache reads {KEY_SCHEMA}"
            raise ValueError(msg)
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names
        if unknown:
            msg = f"model key has unknown fields {sorted(unknown)}"
            raise ValueError(msg)
        data["options"] = tuple(tuple(pair) for pair in data.get("options", ()))
        return cls(**data)

    def short(self) -> str:
        """A readable one-liner for logs and tables."""
        return f"{self.model_id}@{self.revision[:12]} [{self.adapter}, rc={self.rc_mode}, {self.dtype}]"
