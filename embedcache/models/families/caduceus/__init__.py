"""Caduceus-ph and Caduceus-ps (kuleshov-group) in pure PyTorch, no ``mamba_ssm``.

``adapter`` (recognise, load, the adapter), ``network`` (the backbone), ``weights``
(config and tensors of an official state dict), ``init`` (the official random
init), ``scan`` (the selective scan in torch ops) and ``kernels`` (the numba CPU
kernels). May import ``shared``, ``options`` and ``registry``.
"""
