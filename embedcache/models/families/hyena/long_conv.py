"""HyenaDNA's long convolution on CPU: equivalent implementations, one chosen per machine.

``y[g, c, t] = sum_{s <= t} k[t - s, c] v[g, c, s]`` for ``t < L``, channels-first, in
float32 (torch has no bfloat16 FFT on CPU, and the filter's taps are float32 in
either dtype). The candidates (the first is the reference, main's):

- ``fft``: rfft, multiply by the filter's spectrum, irfft at :func:`fft_size`, the
  smallest ``2^a 3^b >= 2L - 1``;
- ``fft-pow2``: the same at the next power of two;
- ``fft-2357``: the same at the smallest size with factors 2, 3, 5 and 7 only;
- ``direct`` (``L <= DIRECT_MAX``, 128): one matmul a channel with the filter's
  lower-triangular Toeplitz matrix (kept per length, as the spectra are).

They agree within float32's tolerance (checked by the tuner on every tuning), so the
choice stays out of the key; :func:`choose` asks the tuner per (padded length,
d_model). Each sequence is padded to its own length's bucket, so one sequence always
meets the same choice on one machine.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

import torch

from embedcache.models.families.hyena.filter import fft_size

if TYPE_CHECKING:
    from embedcache.models.families.hyena.filter import ImplicitFilter
    from embedcache.models.shared.tuning import Tuner

DIRECT_MAX = 128  # a (d, L, L) float32 matrix a layer and length: 16 MB at d 256
DIRECT_ROWS = 8
CANDIDATES = ("fft", "fft-pow2", "fft-2357", "direct")


@cache
def size(name: str, length: int) -> int:
    """The length of the zero-padded input ``name`` reads (``L`` for ``direct``)."""
    need = 2 * length - 1
    if name == "fft":
        return fft_size(length)
    if name == "fft-pow2":
        return 1 << (need - 1).bit_length()
    if name == "fft-2357":
        n = need
        while _strip(n, (2, 3, 5, 7)) != 1:
            n += 1
        return n
    return length


def _strip(n: int, primes: tuple[int, ...]) -> int:
    for p in primes:
        while n % p == 0:
            n //= p
    return n


def convolve(
    name: str, v: torch.Tensor, length: int, filt: ImplicitFilter
) -> torch.Tensor:
    """``v`` (b, d, size(name, length)) float32, zero from ``length`` on -> ``y``
    (b, d, >= length) float32, of which the first ``length`` positions are the result
    """
    if name == "direct":
        return _direct(v, filt.toeplitz(length))
    n = v.shape[2]
    return torch.fft.irfft(torch.fft.rfft(v).mul_(filt.spectrum(length, n)), n=n)


def _direct(v: torch.Tensor, toeplitz: torch.Tensor) -> torch.Tensor:
    """``v`` (b, d, L) by the (d, L, L) matrices, DIRECT_ROWS sequences a matmul
    (zeros fill the last): a BLAS picks its kernels by the matrices' shapes, so a
    fixed shape keeps a sequence's bits independent of its batch."""
    n_seq, d, length = v.shape
    out = torch.empty((n_seq, d, length))
    for start in range(0, n_seq, DIRECT_ROWS):
        rows = v[start : start + DIRECT_ROWS]
        if rows.shape[0] < DIRECT_ROWS:
            rows = torch.cat(
                [rows, rows.new_zeros((DIRECT_ROWS - len(rows), d, length))]
            )
        y = torch.matmul(rows.transpose(0, 1), toeplitz.mT)  # (d, rows, L)
        out[start : start + DIRECT_ROWS] = y.transpose(0, 1)[: n_seq - start]
    return out


def choose(tuner: Tuner, filt: ImplicitFilter, length: int) -> str:
    """The fastest candidate for ``length`` on this machine (see ``tuning``)."""
    from embedcache.models.shared.tuning import Candidate, Problem

    names = [n for n in CANDIDATES if n != "direct" or length <= DIRECT_MAX]
    d = filt.bias.shape[0]

    def make_input() -> torch.Tensor:
        # half a batch of the adapter's token budget: direct's matmuls are
        # memory-bound on the matrices when few sequences share them
        g = torch.Generator().manual_seed(0)
        return torch.randn((max(2, 4096 // length), d, length), generator=g)

    def runner(name: str):  # noqa: ANN202
        def run(v: torch.Tensor) -> torch.Tensor:
            padded = torch.zeros((v.shape[0], d, size(name, length)))
            padded[..., :length] = v
            return convolve(name, padded, length, filt)[..., :length]

        return run

    with torch.inference_mode():
        return tuner.choose(
            Problem("longconv", "float32", str(length), f"d_model={d}"),
            [Candidate(name, runner(name)) for name in names],
            make_input,
        )


__all__ = ["CANDIDATES", "DIRECT_MAX", "choose", "convolve", "size"]
