"""What the families share, once.

``checkpoint`` (the :class:`~embedcache.models.shared.checkpoint.Source` a family
loads from, options, random-init twins), ``encoder`` (the token-based adapter),
``weights`` (reading state dicts strictly), ``meta_init`` (building without init),
``config_fields``, the tokenizers (``tokenizer_json``, ``esm_tokens``,
``char_tokens``), ``bert_modules`` and ``bert_init`` (BERT's building blocks and
init), ``jitcache`` (the numba kernel cache) and ``cpu_features``. May import the
bottom floor, ``options`` and ``base``; never a family. torch loads only in the
modules that build networks.
"""
