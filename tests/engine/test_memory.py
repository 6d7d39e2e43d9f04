"""keep_freed_memory and return_freed_memory: big blocks kept in the heap, or handed back."""

from __future__ import annotations

import ctypes

import pytest

from tests.fresh_python import fresh_python

# in a fresh process: the setting is process-wide and other tests may have made it
FAULTS = """
import resource, sys
import numpy as np
from embedcache.engine.memory import keep_freed_memory, return_freed_memory

def faults(n_bytes):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = np.empty(n_bytes, dtype=np.uint8)
    block.fill(1)  # touch every page
    del block
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
"""
PROBE = (
    FAULTS
    + """
n_bytes = 64 << 20  # above the 32 MiB that glibc's own threshold can reach
faults(n_bytes)
mapped = faults(n_bytes)
kept = keep_freed_memory()
faults(n_bytes)  # the first block from the heap grows it once
print(mapped, kept, faults(n_bytes))
"""
)


@pytest.mark.skipif(
    not hasattr(ctypes.CDLL(None), "mallopt"), reason="needs glibc's mallopt"
)
def test_a_freed_64_mib_block_is_reused_without_page_faults():
    out = fresh_python(PROBE).split()
    mapped, kept, reused = int(out[0]), out[1], int(out[2])
    # 64 MiB is 32 huge pages or 16,384 small ones: mapped afresh, every one faults
    assert mapped >= 32
    assert kept == "True"
    assert reused <= 2


RETURN_PROBE = (
    FAULTS
    + """
assert {"keep": keep_freed_memory, "return": return_freed_memory}[sys.argv[1]]()
n_bytes = 1 << 20  # above glibc's starting threshold (128 KiB)
faults(n_bytes)
faults(n_bytes)
print(faults(n_bytes))
"""
)


@pytest.mark.skipif(
    not hasattr(ctypes.CDLL(None), "mallopt"), reason="needs glibc's mallopt"
)
def test_with_return_freed_memory_a_freed_1_mib_block_goes_back_to_the_kernel():
    def third_block_faults(mode):
        return int(fresh_python(RETURN_PROBE, mode))

    # kept, the block is reused from the heap: no faults; returned, every allocation
    # maps 256 fresh 4 KiB pages. (glibc's default lies between, and differed between
    # runs of the suite: it is not compared.)
    assert third_block_faults("keep") <= 16
    assert third_block_faults("return") >= 200
