"""GENA-LM BERT models (AIRI-Institute), without remote code.

``adapter`` (recognise, load, the adapter) and ``network``. May import ``shared``.
"""
