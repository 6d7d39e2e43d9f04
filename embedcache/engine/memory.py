"""Process memory: keep freed activation memory for the next batch instead of
handing it back to the kernel (a network's run), or hand every large block back at
once (the k-mer floors' long runs, where memory, not speed, is the limit).

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
# glibc's own starting threshold: blocks from here up are mapped (and unmapped on free)
RETURN_BYTES = 128 << 10


def keep_freed_memory(limit: int = KEEP_BYTES) -> bool:
    """Ask glibc to serve blocks up to ``limit`` bytes from its heap and to keep up to
    ``limit`` bytes of freed heap rather than returning it to the kernel.

    A process-wide setting, made by the in-process embedding path (which owns the
    process for the length of the call). Returns False, changing nothing, where the
    C library has no ``mallopt`` (not glibc) or refuses the values.
    """
    done = _mallopt(_M_MMAP_THRESHOLD, limit) and _mallopt(_M_TRIM_THRESHOLD, limit)
    logger.debug("malloc keeps freed blocks up to %d bytes: %s", limit, done)
    return done


def return_freed_memory(threshold: int = RETURN_BYTES) -> bool:
    """Ask glibc to map every block of ``threshold`` bytes or more on its own, so
    that freeing it hands it back to the kernel at once.

    glibc raises its own threshold (up to 32 MiB) each time it frees a mapped block;
    later blocks of that size then come from the heap, and a heap whose top is still
    in use keeps them after they are freed. Over a million-sequence run of a k-mer
    floor those kept temporaries (look-up chunks, merges, read-back) grew the peak
    (docs/design/engine-memory.md). Returns False, changing nothing, without
    ``mallopt``.
    """
    done = _mallopt(_M_MMAP_THRESHOLD, threshold)
    logger.debug("malloc maps blocks from %d bytes: %s", threshold, done)
    return done


def _mallopt(param: int, value: int) -> bool:
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt(param, value) == 1


__all__ = ["KEEP_BYTES", "RETURN_BYTES", "keep_freed_memory", "return_freed_memory"]
