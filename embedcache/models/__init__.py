"""Models: a model name in, an adapter with a fully resolved key out.

This module only hands names on; the registry and the one family dispatch are in
:mod:`.registry` (:func:`load_adapter`, :func:`recognise_family`, :data:`FAMILY_MODULES`).

What the package holds:

- ``registry``: names to adapters, the hub and local directories, family recognition;
- ``base`` (the :class:`~embedcache.models.base.Adapter` protocol), ``options`` (the
  options record), ``catalogue`` (with ``catalogue.toml``: the known checkpoints) and
  ``architectures/`` (configs shipped without weights);
- ``families/<name>/``: one subpackage per family (``caduceus``, ``hyena``, ``ntv2``,
  ``dnabert2``, ``gena``, ``generator``, ``hf``, and ``bert``, ``hf``'s plain BERT
  without transformers), each with its ``adapter`` (recognise, load) and ``network``,
  plus ``weights``, ``kernels`` (numba), ``scan``, ``init``, ``filter``,
  ``checkpoint`` where the family needs them;
- ``shared/``: what families share, once (``checkpoint``: the source, options,
  random-init twins; ``encoder``: the token-based adapter; ``weights``; ``meta_init``;
  ``config_fields``; ``tokenizer_json``, ``esm_tokens``, ``char_tokens``;
  ``bert_modules``, ``bert_init``; ``jitcache``: the numba kernel cache;
  ``cpu_features``);
- ``floors/``: the built-in floors (``kmer``, ``gc_content``), numpy only.

What it may import: the bottom floor only (``embedcache.errors``, ``hashing``,
``specs``), never ``data``, ``store``, ``engine``, ``analysis``, ``report`` or ``cli``.
Heavy libraries (torch, transformers) are imported inside functions or in a family's
``network``/``kernels`` modules, which load only when that family does: importing
this package imports no torch.
"""

from __future__ import annotations

from embedcache.models.options import EmbedOptions
from embedcache.models.registry import (
    BUILTIN_ARCHITECTURES,
    BUILTIN_MODELS,
    FAMILY_MODULES,
    LOCAL_MODEL_ID,
    describe_config,
    family_module,
    layer_count,
    load_adapter,
    local_revision,
    read_config,
    recognise_family,
    resolve_device,
    resolve_hub_model,
)
from embedcache.models.shared.cpu_features import cpu_kind, resolve_dtype

__all__ = [
    "BUILTIN_ARCHITECTURES",
    "BUILTIN_MODELS",
    "FAMILY_MODULES",
    "LOCAL_MODEL_ID",
    "EmbedOptions",
    "cpu_kind",
    "describe_config",
    "family_module",
    "layer_count",
    "load_adapter",
    "local_revision",
    "read_config",
    "recognise_family",
    "resolve_device",
    "resolve_dtype",
    "resolve_hub_model",
]
