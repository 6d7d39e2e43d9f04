"""The fallback family: native transformers encoders (BERT, ESM / NT v1, DNABERT...).

``adapter`` (recognise, load through ``AutoModel`` with strict weights), ``family``
(its name, version and batching rules, shared with ``bert``) and
``network`` (a transformers model behind the encoder network call, also used by
``generator``). A plain BERT loads through ``bert`` instead, without transformers.
May import ``shared`` and ``bert``.
"""
