"""The served models: each one adapter, loaded once, and one store key."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from embedcache.service.errors import ServedModelNotFoundError

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from embedcache.engine.batching import BatchRule
    from embedcache.models.base import Adapter
    from embedcache.models.options import EmbedOptions
    from embedcache.service.settings import ModelSpec
    from embedcache.specs import ModelKey

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedModel:
    """One model as served: its name, adapter, batching rule and options."""

    name: str
    spec: ModelSpec
    adapter: Adapter
    rule: BatchRule
    options: EmbedOptions

    @property
    def key(self) -> ModelKey:
        return self.adapter.key

    @property
    def dim(self) -> int:
        return int(self.adapter.dim)

    def info(self) -> dict[str, Any]:
        """The /v1/models entry: OpenAI's fields, then the key and its options."""
        options = self.options.to_dict()
        options.pop("device", None)  # where it runs, not what it computes
        return {
            "id": self.name,
            "object": "model",
            "created": 0,
            "owned_by": "embedcache",
            "key_digest": self.key.digest,
            "dtype": self.key.dtype,  # resolved: replicas of one name must agree
            "key": self.key.to_dict(),
            "dim": self.dim,
            "family": self.key.adapter,
            "max_tokens": self.adapter.max_tokens,
            "options": options,
        }


class ModelRegistry:
    """The served models by the names a client may send: the served name, the
    model as configured, or the key digest (never a path on the server)."""

    def __init__(self, models: Iterable[ServedModel]) -> None:
        self.models = list(models)
        self._by_name: dict[str, ServedModel] = {}
        for model in self.models:
            for alias in (model.spec.model, model.key.digest):
                self._by_name.setdefault(alias, model)
        for model in self.models:
            self._by_name[model.name] = model  # a served name always wins

    @property
    def names(self) -> list[str]:
        return [model.name for model in self.models]

    def get(self, name: str) -> ServedModel:
        """The served model called ``name``.

        Raises
        ------
        ServedModelNotFoundError
            No served model has that name; the message lists the served names.
        """
        model = self._by_name.get(name)
        if model is None:
            msg = f"model {name!r} is not served here; served models are {self.names}"
            raise ServedModelNotFoundError(msg)
        return model


def load_models(
    specs: Sequence[ModelSpec], *, threads: int | None = None
) -> list[ServedModel]:
    """Load every served model once, with its options resolved as `embed` does."""
    from embedcache.engine.api import embed_options
    from embedcache.engine.budget import tuned_batch_rule
    from embedcache.models import load_adapter

    if threads:
        import torch

        torch.set_num_threads(threads)
    served = []
    for spec in specs:
        opts = embed_options(spec.model, spec.options, revision=spec.revision)
        adapter = load_adapter(spec.model, revision=spec.revision, **opts.to_dict())
        rule = tuned_batch_rule(adapter, spec.token_budget)
        logger.info(
            "serving %s as %r (key %s)",
            adapter.key.short(),
            spec.name,
            adapter.key.digest[:12],
        )
        served.append(ServedModel(spec.name, spec, adapter, rule, opts))
    return served


__all__ = ["ModelRegistry", "ServedModel", "load_models"]
