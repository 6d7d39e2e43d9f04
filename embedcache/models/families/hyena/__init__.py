"""HyenaDNA (LongSafari) in plain PyTorch, without remote code.

``adapter`` (recognise, load, the adapter), ``network`` (operator, blocks, backbone),
``checkpoint`` (config and tensor names), ``filter`` (the long implicit and the short
filter) and ``kernels`` (numba CPU kernels). May import ``shared`` and, in
``kernels``, the numba helpers of ``caduceus.kernels``.
"""
