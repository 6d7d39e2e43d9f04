"""HyenaDNA's filters: the long implicit filter and the short depthwise one.

The long filter is a small MLP with sine activations over positional features ``z``,
windowed by an exponential decay, plus a per-channel bias D; its taps are convolved
by FFT at a size of at least 2L - 1 (:func:`fft_size`), so the convolution is linear
and causal. ``z``, ``t`` and the decay rates ``deltas`` are stored in the published
checkpoints and loaded; they are computed here only for a random initialisation.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from embedcache.models.families.hyena.checkpoint import SHORT_FILTER

if TYPE_CHECKING:
    from collections.abc import Callable

    from embedcache.models.families.hyena.checkpoint import HyenaArch

# the window added to the exponential decay, and the decay range (official defaults)
_SHIFT = 0.05
_FAST_DECAY_PCT = 0.3
_SLOW_DECAY_PCT = 1.5
_TARGET = 1e-2
# filter FFTs kept per layer (one per padded length seen; the engine's batches reuse few)
_KERNEL_CACHE = 8


def positional_features(
    seq_len: int, emb_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``z`` (1, L, emb_dim) and ``t`` (1, L, 1) as the official code initialises them:
    normalised time, then the cosines and sines of ``(emb_dim - 1) // 2`` bands."""
    t = torch.linspace(0, 1, seq_len)[None, :, None]
    bands = (emb_dim - 1) // 2
    w = 2 * math.pi * torch.linspace(0, seq_len - 1, seq_len)[None, :, None] / seq_len
    f = torch.linspace(1e-4, bands - 1, bands)[None, None]
    return torch.cat([t, torch.cos(-f * w), torch.sin(-f * w)], dim=-1), t


class Sin(nn.Module):
    """``sin(freq * x)``; ``freq`` (1, filter_order) is trained and stored, or constant."""

    def __init__(self, arch: HyenaArch) -> None:
        super().__init__()
        freq = torch.full((1, arch.filter_order), arch.activation_freq)
        if arch.train_freq:
            self.freq = nn.Parameter(freq)
        else:  # a constant of the config, absent from checkpoints
            self.register_buffer("freq", freq, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.freq * x)


class PositionalFeatures(nn.Module):
    """Holds the stored ``z`` and ``t`` (loaded with the checkpoint)."""

    def __init__(self, arch: HyenaArch) -> None:
        super().__init__()
        z, t = positional_features(arch.max_seq_len, arch.emb_dim)
        self.register_buffer("z", z)
        self.register_buffer("t", t)


class Modulation(nn.Module):
    """The exponential decay window; ``deltas`` (1, 1, d_model) is stored."""

    def __init__(self, arch: HyenaArch) -> None:
        super().__init__()
        fast = math.log(_TARGET) / _FAST_DECAY_PCT
        slow = math.log(_TARGET) / _SLOW_DECAY_PCT
        self.register_buffer(
            "deltas", torch.linspace(slow, fast, arch.d_model)[None, None]
        )


class ImplicitFilter(nn.Module):
    """The long filter: an MLP with sine activations over ``z``, windowed by a decay.

    ``implicit_filter`` is laid out as the checkpoints name it: linear layers at even
    indices, the one shared :class:`Sin` at every odd index (stored once, at 1).
    """

    def __init__(self, arch: HyenaArch) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(arch.d_model))  # D
        self.pos_emb = PositionalFeatures(arch)
        self.modulation = Modulation(arch)
        sin = Sin(arch)
        order = arch.filter_order
        stack: list[nn.Module] = [nn.Linear(arch.emb_dim, order), sin]
        for _ in range(arch.num_inner_mlps):
            stack += [nn.Linear(order, order), sin]
        stack.append(nn.Linear(order, arch.d_model, bias=False))
        self.implicit_filter = nn.Sequential(*stack)
        self._spectra: dict[tuple[Any, ...], torch.Tensor] = {}

    def kernel(self, length: int) -> torch.Tensor:
        """The filter's first ``length`` taps, (length, d_model) float32."""
        z = self.pos_emb.z[0, :length].float()
        t = self.pos_emb.t[0, :length].float()
        h = self.implicit_filter(z)
        decay = torch.exp(-t * self.modulation.deltas[0].abs().float())
        return h * (decay + _SHIFT)

    def spectrum(self, length: int, n: int) -> torch.Tensor:
        """rfft of the first ``length`` taps at FFT size ``n``: (d_model, n // 2 + 1).

        Without gradients (inference) it is kept per (length, n): the weights are
        frozen once loaded; moving or casting the module drops what is kept.
        """
        return self._kept(
            ("spectrum", length, n),
            lambda: torch.fft.rfft(self.kernel(length).T, n=n),
        )

    def toeplitz(self, length: int) -> torch.Tensor:
        """(d_model, L, L): ``k[t - s]`` at ``[c, t, s]`` for ``s <= t``, else 0 (the
        direct causal convolution's matrices); kept as :meth:`spectrum` is."""

        def build() -> torch.Tensor:
            lag = torch.arange(length)[:, None] - torch.arange(length)[None, :]
            taps = self.kernel(length).T  # (d, L)
            return taps[:, lag.clamp(min=0)] * (lag >= 0)

        return self._kept(("toeplitz", length), build)

    def _kept(
        self, key: tuple[Any, ...], build: Callable[[], torch.Tensor]
    ) -> torch.Tensor:
        if torch.is_grad_enabled():
            return build()
        key = (*key, str(self.bias.device))
        cached = self._spectra.get(key)
        if cached is None:
            cached = build()
            if len(self._spectra) >= _KERNEL_CACHE:
                self._spectra.pop(next(iter(self._spectra)))
            self._spectra[key] = cached
        return cached

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> ImplicitFilter:  # noqa: ANN401
        self._spectra.clear()  # moved or cast: the kept spectra are stale
        return super()._apply(fn, *args, **kwargs)


def fft_size(length: int) -> int:
    """The smallest 2^a 3^b >= 2 * length - 1: a linear (not circular) convolution.

    The published code uses 2 * length, which for a 501-token input is
    1002 = 2 * 3 * 167 and needs the slow prime-size path; any size from
    2 * length - 1 on gives the same causal convolution.
    """
    need = 2 * length - 1
    best = 1 << (need - 1).bit_length()  # the next power of two
    power3 = 3
    while power3 < best:
        size = power3 * (1 << max(0, -(-need // power3) - 1).bit_length())
        best = min(best, size)
        power3 *= 3
    return best


class ShortFilter(nn.Module):
    """Depthwise causal convolution of width 3 along the sequence (channels-first)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(channels, 1, SHORT_FILTER))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor, length: int) -> torch.Tensor:
        # padding 2 and the first `length` outputs: out[i] sees x[i - 2 .. i]
        return F.conv1d(
            x,
            self.weight.float(),
            self.bias.float(),
            padding=SHORT_FILTER - 1,
            groups=x.shape[1],
        )[..., :length]


__all__ = [
    "ImplicitFilter",
    "Modulation",
    "PositionalFeatures",
    "ShortFilter",
    "Sin",
    "fft_size",
    "positional_features",
]
