"""Model families: one subpackage per family, each behind the registry's one dispatch.

Each family's ``adapter`` module has ``FAMILY``, ``recognise(config, folder)`` and
``load(source)`` (the registry's :data:`~embedcache.models.registry.FAMILY_MODULES`
names them, most specific first); its ``network`` is the PyTorch module the weights
load into. ``bert`` is no family of its own: it is ``hf``'s plain BERT, loaded without
transformers, under ``hf``'s family name and key.

What a family may import: the bottom floor, ``embedcache.models.options``, ``base``,
``registry`` (for resolving a folder), ``shared`` and its own modules; another family
only where named in its docstring. torch, transformers and numba load in ``network``,
``kernels`` and inside functions, never when an ``adapter`` module is imported alone
(``embedcache models`` reads every adapter's docstring).
"""
