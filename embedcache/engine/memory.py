"""Process memory: keep freed activation memory for the next batch instead of
handing it back to the kernel.

glibc serves allocations above its mmap threshold (at most 32 MiB when it adjusts
it itself) with fresh ``mmap`` pages and unmaps them on free, so every forward pass
of a batch whose activations exceed it faults in and zeroes those pages again, each
layer. An NT-v2 50m forward at 4,096 tokens made 218,000 minor page faults (0.2 s of
system time); with the thresholds raised it makes none.
"""

from __future__ import annotations

import ctypes
import logging

logger = logging.getLogger(__name__)

# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# blocks up to this size come from (and return to) the heap; larger ones are mapped
KEEP_BYTES = 1 << 30


def keep_freed_memory(limit: int = KEEP_BYTES) -> bool:
    """Ask glibc to serve blocks up to ``limit`` bytes from its heap and to keep up to
    ``limit`` bytes of freed heap rather than returning it to the kernel.

    A process-wide setting, made by the in-process embedding path (which owns the
    process for the length of the call). Returns False, changing nothing, where the
    C library has no ``mallopt`` (not glibc) or refuses the values.
    """
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    done = mallopt(_M_MMAP_THRESHOLD, limit) == 1
    done = mallopt(_M_TRIM_THRESHOLD, limit) == 1 and done
    logger.debug("malloc keeps freed blocks up to %d bytes: %s", limit, done)
    return done


__all__ = ["KEEP_BYTES", "keep_freed_memory"]
