"""Nucleotide Transformer v2 (InstaDeepAI), without remote code or transformers.

``adapter`` (recognise, load, the adapter; tokens from ``shared.esm_tokens``) and
``network``. May import ``shared``.
"""
