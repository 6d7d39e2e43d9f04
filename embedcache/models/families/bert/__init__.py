"""``hf``'s plain BERT, without transformers: same vectors, same family name and key.

``adapter`` (:func:`~embedcache.models.families.bert.adapter.load_native_bert`: a
plain BERT config with a plain ``tokenizer.json``, else None) and ``network``
(``BertModel``'s arithmetic in plain PyTorch). May import ``shared`` and ``hf``'s
adapter (the family name, version and token limits are ``hf``'s).
"""
