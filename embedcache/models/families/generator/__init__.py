"""GENERator: Llama decoders, loaded through transformers' native Llama class.

``adapter`` (recognise, load, the adapter and its 6-mer tokens); the network is
``hf.network``'s transformers wrapper. May import ``shared``, ``options`` and
``hf.network``.
"""
