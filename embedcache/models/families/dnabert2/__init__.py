"""DNABERT-2 and DNABERT-S (MosaicBERT), without their remote code.

``adapter`` (recognise, load, the adapter; the BPE tokens from ``tokenizers``) and
``network``. May import ``shared`` and, for a config that is a plain BERT, ``hf``'s
adapter.
"""
