"""The length a sequence is padded to: a bucket of its own token count.

A row's floating-point work in a forward pass depends on the length its batch is
padded to (attention kernels block the keys by it, a FFT's size follows it) but,
measured on this project's CPUs, not on the other rows, their number or the row's
place among them: a 256-wide 4-layer BERT gave bit-identical vectors for one
sequence alone or among 1-31 others at one padded length, fp32 and bf16, 1 or 2
threads, while padding it to 152 instead of 160 tokens changed its bits. So every
sequence is padded to :func:`padded_length` of its own token count, never to the
longest of its batch, and its vector is then a function of the key and the
sequence alone (docs/reproducibility.md).
"""

from __future__ import annotations

# Buckets are MIN_STEP tokens apart below 256 tokens and a sixteenth of an octave
# above (32 from 512, 64 from 1,024, ...): at most 1/16 more padded tokens there,
# and few enough lengths that length-sorted batches stay full.
MIN_STEP = 16
OCTAVE_SPLITS_LOG2 = 4


def padded_length(n_tokens: int, *, limit: int | None = None) -> int:
    """The padded length of a sequence of ``n_tokens`` tokens: the bucket above it,
    at most ``limit`` (the model's context; never below ``n_tokens``)."""
    step = max(MIN_STEP, 1 << max(n_tokens.bit_length() - 1 - OCTAVE_SPLITS_LOG2, 0))
    bucket = -(-n_tokens // step) * step
    if limit is not None:
        bucket = min(bucket, max(limit, n_tokens))
    return bucket


__all__ = ["MIN_STEP", "padded_length"]
