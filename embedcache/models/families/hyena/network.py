"""HyenaDNA's network in plain PyTorch: the architecture of the published checkpoints.

A stack of blocks ``x + MLP(LN(x + Hyena(LN(x))))`` over a padded embedding matrix,
then a final LayerNorm. The Hyena operator (order 2) projects each position to
3 x d_model channels, runs a short depthwise causal convolution (width 3) over them,
splits them into two gates and a value, and convolves the gated value with a long
implicit filter: a small MLP with sine activations over positional features ``z``,
windowed by an exponential decay, plus a per-channel bias D. The long convolution
runs by FFT in float32 at a size of at least 2L - 1 (:func:`fft_size`), so it is a
linear, causal convolution: position ``i`` sees positions ``<= i`` only, and padding a
sequence on the right leaves its own positions exactly as they were.

Tensor names follow the published checkpoints (``layers.<i>.mixer.filter_fn.pos_emb.z``
...), so a checkpoint loads by name; ``z``, ``t`` and the decay rates ``deltas`` are
stored there and are loaded, never recomputed (they are computed only for a random
initialisation). The computation differs from the published code's where that is
faster and the result the same: the operator works channels-first between its
projections, the FFT size is a fast one, the filter's spectrum is kept per length,
and on CPU (``set_kernels("numba")``) everything between the matmuls and the FFTs
runs in the kernels of :mod:`.kernels`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from embedcache.models.families.hyena.checkpoint import SHORT_FILTER
from embedcache.models.families.hyena.filter import (
    ImplicitFilter,
    ShortFilter,
    fft_size,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from embedcache.models.families.hyena.checkpoint import HyenaArch

_BLOCK_NORM_EPS = 1e-5  # the blocks' LayerNorms use torch's default, not the config's
KERNELS = ("numba", "torch")


class Projection(nn.Linear):
    """A linear layer computing in its weight's dtype; returns that dtype.

    The bias stays float32 (the CPU kernels add it in float32 after the matmul).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        b = None if self.bias is None else self.bias.to(w.dtype)
        return F.linear(x.to(w.dtype), w, b)


class HyenaOperator(nn.Module):
    """Order-2 Hyena: in_proj -> short causal conv -> gate -> long FFT conv -> gate -> out_proj.

    Works channels-first, (batch, channels, length), between the projections: the
    short convolution and the FFTs then run along contiguous memory.
    """

    def __init__(self, arch: HyenaArch) -> None:
        super().__init__()
        d = arch.d_model
        self.d_model = d
        self.max_seq_len = arch.max_seq_len
        self.in_proj = Projection(d, 3 * d)
        self.out_proj = Projection(d, d)
        # depthwise, width 3, stored as nn.Conv1d stores it: (channels, 1, 3)
        self.short_filter = ShortFilter(3 * d)
        self.filter_fn = ImplicitFilter(arch)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        """(b, L, d) float32 -> (b, L, d) in the projections' dtype (torch ops)."""
        length = u.shape[1]
        _check_length(length, self.max_seq_len)
        proj = self.in_proj
        z = torch.matmul(proj.weight, u.to(proj.weight.dtype).transpose(1, 2))
        # float32 from here: the in_proj bias joins the cast, then the short filter
        z = self.short_filter(torch.add(z, proj.bias.float()[:, None]), length)
        d = self.d_model
        x0, x1, v = z[:, :d], z[:, d : 2 * d], z[:, 2 * d :]
        v = v * x1
        n = fft_size(length)
        y = torch.fft.irfft(
            torch.fft.rfft(v, n=n).mul_(self.filter_fn.spectrum(length, n)), n=n
        )[..., :length]
        y = y.addcmul_(v, self.filter_fn.bias.float()[:, None]).mul_(x0)
        w = self.out_proj.weight
        out = torch.matmul(y.to(w.dtype).transpose(1, 2), w.T)
        return out.add_(self.out_proj.bias.to(w.dtype))

    def forward_numba(
        self, u: torch.Tensor, v: torch.Tensor, long_conv: str
    ) -> torch.Tensor:
        """The CPU path: ``u`` (b, L, d) in the projections' dtype (the normed input)
        -> (b, L, d) out_proj's matmul, its bias not yet added (:func:`add_norm`
        adds it); matmuls and the long convolution (``long_conv``, a candidate of
        :mod:`.long_conv`) in torch, the rest in two numba kernels. ``v`` (b, d, n)
        float32, zero from L on: the long convolution's input, written here (the
        zeros are left as they are, so one buffer serves every block)."""
        from embedcache.models.families.hyena import kernels
        from embedcache.models.families.hyena.long_conv import convolve

        n_seq, length, _ = u.shape
        _check_length(length, self.max_seq_len)
        # in_proj writes channels-first itself: the input transposed, one matmul
        # for the batch, (3d, b L); torch.matmul(W, u.mT) computed (b, L, 3d) and
        # copied it transposed
        z = torch.mm(self.in_proj.weight, u.reshape(n_seq * length, -1).T)
        conv = (
            _numpy(z),
            _numpy(self.in_proj.bias),
            _numpy(self.short_filter.weight[:, 0]),  # (3d, 3), a view
            _numpy(self.short_filter.bias),
        )
        kernels.short_conv_gate(*conv, v.numpy())
        y = convolve(long_conv, v, length, self.filter_fn)
        gated = torch.empty((self.d_model, n_seq * length), dtype=u.dtype)
        d_bias = _numpy(self.filter_fn.bias)
        kernels.gate_out(y.numpy(), v.numpy(), *conv, d_bias, _numpy(gated))
        # out_proj reads the (d, b L) gate transposed: no copy either
        out = torch.mm(gated.T, self.out_proj.weight.T)
        return out.view(n_seq, length, -1)


def _check_length(length: int, max_seq_len: int) -> None:
    if length > max_seq_len:
        msg = f"{length} tokens exceed the model's {max_seq_len}"
        raise ValueError(msg)


def _numpy(t: torch.Tensor) -> Any:  # noqa: ANN401
    """A CPU tensor as numpy; bfloat16 as its bits (int16), which the kernels read."""
    t = t.detach()
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()


class Mlp(nn.Module):
    def __init__(self, arch: HyenaArch) -> None:
        super().__init__()
        self.fc1 = Projection(arch.d_model, arch.d_inner)
        self.fc2 = Projection(arch.d_inner, arch.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # in the projections' dtype throughout (bf16: the GELU's output too)
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))

    def forward_numba(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` in the projections' dtype -> fc2's matmul, its bias not yet added."""
        from embedcache.models.families.hyena import kernels

        h = F.linear(x, self.fc1.weight)
        kernels.gelu_tanh(_numpy(h.view(-1, h.shape[-1])), _numpy(self.fc1.bias))
        return F.linear(h, self.fc2.weight)


class HyenaBlock(nn.Module):
    def __init__(self, arch: HyenaArch) -> None:
        super().__init__()
        self.mixer = HyenaOperator(arch)
        self.norm1 = nn.LayerNorm(arch.d_model, eps=_BLOCK_NORM_EPS)
        self.mlp = Mlp(arch)
        self.norm2 = nn.LayerNorm(arch.d_model, eps=_BLOCK_NORM_EPS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the residual stream stays float32; a bf16 branch is promoted as it is added
        x = torch.add(x, self.mixer(self.norm1(x)))
        return torch.add(x, self.mlp(self.norm2(x)))


class Embeddings(nn.Module):
    def __init__(self, arch: HyenaArch) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(arch.embedding_rows, arch.d_model)


class HyenaBackbone(nn.Module):
    """The backbone as an :class:`~embedcache.models.shared.encoder.EncoderNetwork`.

    ``forward(ids, attention_mask, layers)``: ``ids`` (b, t) right-padded; the mask is
    not needed (the model is causal and padding is on the right). Layer -1 is the
    final LayerNorm's output, 0 the embedding output, ``i`` block ``i``'s output.
    """

    def __init__(self, arch: HyenaArch) -> None:
        super().__init__()
        self.arch = arch
        self.n_layers = arch.n_layer
        self.hidden_size = arch.d_model
        self.embeddings = Embeddings(arch)
        self.layers = nn.ModuleList(HyenaBlock(arch) for _ in range(arch.n_layer))
        self.ln_f = nn.LayerNorm(arch.d_model, eps=arch.layer_norm_epsilon)
        self.kernels = "torch"

    def set_compute_dtype(self, dtype: torch.dtype) -> None:
        """Run the four projections of every block in ``dtype`` (the rest stays float32)."""
        for module in self.modules():
            if isinstance(module, Projection):
                module.weight.data = module.weight.data.to(dtype)

    def set_kernels(self, kernels: str) -> None:
        """``"numba"`` (compiled CPU kernels between the matmuls) or ``"torch"``."""
        if kernels not in KERNELS:
            msg = f"kernels {kernels!r} is not one of {KERNELS}"
            raise ValueError(msg)
        self.kernels = kernels

    def forward(
        self,
        ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        layers: Sequence[int] = (-1,),
    ) -> list[torch.Tensor]:
        want = set(layers)
        last = max((i for i in want if i >= 0), default=-1)
        depth = self.n_layers if -1 in want else last
        x = self.embeddings.word_embeddings(ids).float()
        if self.kernels == "numba":
            out = self._forward_numba(x, want, depth)
            return [out[i] for i in layers]
        out: dict[int, torch.Tensor] = {}
        if 0 in want:
            out[0] = x
        for i, block in enumerate(self.layers[:depth], start=1):
            x = block(x)
            if i in want:
                out[i] = x
        if -1 in want:
            out[-1] = self.ln_f(x)
        return [out[i] for i in layers]

    def _forward_numba(
        self, x: torch.Tensor, want: set[int], depth: int
    ) -> dict[int, torch.Tensor]:
        """The blocks with each residual add fused into the next LayerNorm (CPU)."""
        from embedcache.models.families.hyena import kernels, long_conv
        from embedcache.models.shared.tuning import process_tuner

        out: dict[int, torch.Tensor] = {0: x.clone()} if 0 in want else {}
        d = self.hidden_size
        dtype = self.layers[0].mlp.fc1.weight.dtype
        rows = x.view(-1, d)  # the residual stream, updated in place
        no_rows, no_vector = torch.empty((0, d)), torch.empty(0)
        normed = torch.empty(x.shape, dtype=dtype)
        final = torch.empty(x.shape)
        n_seq, length = x.shape[:2]
        conv = "fft"
        if depth:
            filt = self.layers[0].mixer.filter_fn
            conv = long_conv.choose(process_tuner(), filt, length)
        # the long convolution's input, zero-padded once for every block
        conv_input = torch.zeros((n_seq, d, long_conv.size(conv, length)))

        def add_norm(
            branch: torch.Tensor, bias: torch.Tensor, norm: nn.LayerNorm | None
        ) -> None:
            target = final if norm is self.ln_f else normed
            kernels.add_norm(
                rows.numpy(),
                _numpy(branch.view(-1, d)),
                _numpy(bias),
                _numpy(norm.weight if norm is not None else no_vector),
                _numpy(norm.bias if norm is not None else no_vector),
                np.float32(norm.eps if norm is not None else 0.0),
                _numpy(target.view(-1, d) if norm is not None else no_rows),
            )

        if depth:
            add_norm(no_rows, no_vector, self.layers[0].norm1)
        for i, block in enumerate(self.layers[:depth], start=1):
            mixed = block.mixer.forward_numba(normed, conv_input, conv)
            add_norm(mixed, block.mixer.out_proj.bias, block.norm2)
            h = block.mlp.forward_numba(normed)
            if i < depth:
                add_norm(h, block.mlp.fc2.bias, self.layers[i].norm1)
            else:
                add_norm(h, block.mlp.fc2.bias, self.ln_f if -1 in want else None)
            if i in want:
                out[i] = x.clone()
        if -1 in want:
            out[-1] = final
        return out


def init_official(backbone: HyenaBackbone, *, seed: int) -> None:
    """Random weights the way the official ``_init_weights`` leaves them.

    Linear weights and the embedding ~ N(0, 0.02), linear biases 0 (the official
    initializer ignores the config's ``initializer_range`` and never reaches its
    residual rescaling, whose parameter names never match); the short filter keeps
    torch's Conv1d init, U(+-1/sqrt(3)); D ~ N(0, 1); the sine frequency, ``z``, ``t``
    and the decay rates as constructed; LayerNorms 1 and 0.
    """
    g = torch.Generator().manual_seed(seed)
    bound = 1 / math.sqrt(SHORT_FILTER)
    with torch.no_grad():
        for module in backbone.modules():
            if isinstance(module, nn.Linear):
                module.weight.copy_(
                    torch.randn(module.weight.shape, generator=g) * 0.02
                )
                if module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, nn.Embedding):
                module.weight.copy_(
                    torch.randn(module.weight.shape, generator=g) * 0.02
                )
            elif isinstance(module, ShortFilter):
                for p in (module.weight, module.bias):
                    p.copy_((torch.rand(p.shape, generator=g) * 2 - 1) * bound)
            elif isinstance(module, ImplicitFilter):
                module.bias.copy_(torch.randn(module.bias.shape, generator=g))
            elif isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
                module.bias.zero_()


__all__ = [
    "KERNELS",
    "HyenaBackbone",
    "init_official",
]
