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
runs in the kernels of :mod:`._hyena_numba`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from embedcache.errors import CheckpointError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

# the published configuration class's defaults, for fields a config.json leaves out
CONFIG_DEFAULTS: dict[str, Any] = {
    "vocab_size": 12,
    "d_model": 256,
    "d_inner": None,  # 4 x d_model
    "train_freq": True,
    "max_seq_len": 1024,
    "emb_dim": 3,
    "n_layer": 12,
    "num_inner_mlps": 2,
    "hyena_order": 2,
    "short_filter_order": 3,
    "filter_order": 64,
    "activation_freq": 1,
    "layer_norm_epsilon": 1e-5,
    "pad_vocab_size_multiple": 8,
}
# the window added to the exponential decay, and the decay range (official defaults)
_SHIFT = 0.05
_FAST_DECAY_PCT = 0.3
_SLOW_DECAY_PCT = 1.5
_TARGET = 1e-2
_BLOCK_NORM_EPS = 1e-5  # the blocks' LayerNorms use torch's default, not the config's
_SHORT_FILTER = 3
KERNELS = ("numba", "torch")
# filter FFTs kept per layer (one per padded length seen; the engine's batches reuse few)
_KERNEL_CACHE = 8


@dataclass(frozen=True, slots=True)
class HyenaArch:
    """The shape of a HyenaDNA checkpoint, read from its ``config.json``."""

    vocab_size: int
    embedding_rows: int  # vocab_size padded up to a multiple of pad_vocab_size_multiple
    d_model: int
    n_layer: int
    d_inner: int
    emb_dim: int
    filter_order: int
    num_inner_mlps: int
    max_seq_len: int
    layer_norm_epsilon: float
    train_freq: bool
    activation_freq: float


def arch_from_config(config: Mapping[str, Any], *, where: str) -> HyenaArch:
    """Validate a HyenaDNA ``config.json`` dict and return its architecture.

    Raises
    ------
    CheckpointError
        A field has the wrong type or a value the published architecture does not
        support (Hyena order other than 2, short filter other than 3, even emb_dim).
    """
    c = {**CONFIG_DEFAULTS, **{k: v for k, v in config.items() if v is not None}}
    if config.get("d_inner") is None:
        c["d_inner"] = 4 * _int(c, "d_model", where)
    ints = {
        name: _int(c, name, where)
        for name in (
            "vocab_size",
            "d_model",
            "n_layer",
            "d_inner",
            "emb_dim",
            "filter_order",
            "num_inner_mlps",
            "max_seq_len",
            "pad_vocab_size_multiple",
            "hyena_order",
            "short_filter_order",
        )
    }
    if ints["hyena_order"] != 2:
        msg = (
            f"{where}: hyena_order {ints['hyena_order']} is not supported; the "
            "published HyenaDNA code (and embedcache) runs order 2 only"
        )
        raise CheckpointError(msg)
    if ints["short_filter_order"] != _SHORT_FILTER:
        msg = (
            f"{where}: short_filter_order {ints['short_filter_order']} is not "
            f"supported; the published code pads the short filter by 2, which is "
            f"causal only for width {_SHORT_FILTER}"
        )
        raise CheckpointError(msg)
    if ints["emb_dim"] < 3 or ints["emb_dim"] % 2 == 0:
        msg = (
            f"{where}: emb_dim {ints['emb_dim']} must be odd and >= 3 (time, cos, sin)"
        )
        raise CheckpointError(msg)
    for name in ("num_inner_mlps",):
        if ints[name] < 0:
            msg = f"{where}: {name} {ints[name]} must be >= 0"
            raise CheckpointError(msg)
    for name in ("vocab_size", "d_model", "n_layer", "d_inner", "filter_order"):
        if ints[name] < 1:
            msg = f"{where}: {name} {ints[name]} must be positive"
            raise CheckpointError(msg)
    if ints["max_seq_len"] < 1 or ints["pad_vocab_size_multiple"] < 1:
        msg = f"{where}: max_seq_len and pad_vocab_size_multiple must be positive"
        raise CheckpointError(msg)
    multiple = ints["pad_vocab_size_multiple"]
    rows = -(-ints["vocab_size"] // multiple) * multiple
    try:
        eps = float(c["layer_norm_epsilon"])
        freq = float(c["activation_freq"])
    except (TypeError, ValueError) as err:
        msg = f"{where}: layer_norm_epsilon and activation_freq must be numbers"
        raise CheckpointError(msg) from err
    return HyenaArch(
        vocab_size=ints["vocab_size"],
        embedding_rows=rows,
        d_model=ints["d_model"],
        n_layer=ints["n_layer"],
        d_inner=ints["d_inner"],
        emb_dim=ints["emb_dim"],
        filter_order=ints["filter_order"],
        num_inner_mlps=ints["num_inner_mlps"],
        max_seq_len=ints["max_seq_len"],
        layer_norm_epsilon=eps,
        train_freq=bool(c["train_freq"]),
        activation_freq=freq,
    )


def _int(config: Mapping[str, Any], name: str, where: str) -> int:
    value = config[name]
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f"{where}: {name} must be an integer, got {value!r}"
        raise CheckpointError(msg)
    return value


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
        self._spectra: dict[tuple[int, int, str], torch.Tensor] = {}

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
        if torch.is_grad_enabled():
            return torch.fft.rfft(self.kernel(length).T, n=n)
        key = (length, n, str(self.bias.device))
        cached = self._spectra.get(key)
        if cached is None:
            cached = torch.fft.rfft(self.kernel(length).T, n=n)
            if len(self._spectra) >= _KERNEL_CACHE:
                self._spectra.pop(next(iter(self._spectra)))
            self._spectra[key] = cached
        return cached

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> ImplicitFilter:  # noqa: ANN401
        self._spectra.clear()  # moved or cast: the kept spectra are stale
        return super()._apply(fn, *args, **kwargs)


class Projection(nn.Linear):
    """A linear layer computing in its weight's dtype; returns that dtype.

    The bias stays float32 (the CPU kernels add it in float32 after the matmul).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        b = None if self.bias is None else self.bias.to(w.dtype)
        return F.linear(x.to(w.dtype), w, b)


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

    def forward_numba(self, u: torch.Tensor) -> torch.Tensor:
        """The CPU path: ``u`` (b, L, d) in the projections' dtype (the normed input)
        -> (b, L, d) out_proj's matmul, its bias not yet added (:func:`add_norm`
        adds it); matmuls and FFTs in torch, the rest in two numba kernels."""
        from embedcache.models import _hyena_numba as kernels

        n_seq, length, _ = u.shape
        _check_length(length, self.max_seq_len)
        d = self.d_model
        n = fft_size(length)
        # (b, 3d, L), channels-first; the kernel adds the bias
        z = torch.matmul(self.in_proj.weight, u.transpose(1, 2))
        x0 = torch.empty((n_seq, d, length))
        v = torch.empty((n_seq, d, n))  # zero-padded for the FFT by the kernel
        conv = self.short_filter
        kernels.short_conv_gate(
            _numpy(z),
            _numpy(self.in_proj.bias),
            _numpy(conv.weight[:, 0].float()),
            _numpy(conv.bias),
            x0.numpy(),
            v.numpy(),
        )
        spectrum = self.filter_fn.spectrum(length, n)
        y = torch.fft.irfft(torch.fft.rfft(v).mul_(spectrum), n=n)
        gated = torch.empty((n_seq, length, d), dtype=u.dtype)
        kernels.gate_out(
            y.numpy(), v.numpy(), x0.numpy(), _numpy(self.filter_fn.bias), _numpy(gated)
        )
        return F.linear(gated, self.out_proj.weight)


def _check_length(length: int, max_seq_len: int) -> None:
    if length > max_seq_len:
        msg = f"{length} tokens exceed the model's {max_seq_len}"
        raise ValueError(msg)


def _numpy(t: torch.Tensor) -> Any:  # noqa: ANN401
    """A CPU tensor as numpy; bfloat16 as its bits (int16), which the kernels read."""
    t = t.detach()
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()


class ShortFilter(nn.Module):
    """Depthwise causal convolution of width 3 along the sequence (channels-first)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(channels, 1, _SHORT_FILTER))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor, length: int) -> torch.Tensor:
        # padding 2 and the first `length` outputs: out[i] sees x[i - 2 .. i]
        return F.conv1d(
            x,
            self.weight.float(),
            self.bias.float(),
            padding=_SHORT_FILTER - 1,
            groups=x.shape[1],
        )[..., :length]


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
        from embedcache.models import _hyena_numba as kernels

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
    """The backbone as an :class:`~embedcache.models.encoder.EncoderNetwork`.

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
        from embedcache.models import _hyena_numba as kernels

        out: dict[int, torch.Tensor] = {0: x.clone()} if 0 in want else {}
        d = self.hidden_size
        dtype = self.layers[0].mlp.fc1.weight.dtype
        rows = x.view(-1, d)  # the residual stream, updated in place
        no_rows, no_vector = torch.empty((0, d)), torch.empty(0)
        normed = torch.empty(x.shape, dtype=dtype)
        final = torch.empty(x.shape)

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
            mixed = block.mixer.forward_numba(normed)
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


def prepare_state(
    state: Mapping[str, torch.Tensor], arch: HyenaArch, *, where: str
) -> dict[str, torch.Tensor]:
    """A checkpoint's backbone tensors, renamed and completed for :class:`HyenaBackbone`.

    Accepts ``hyena.backbone.*`` (the CausalLM and classification classes) and
    ``backbone.*`` (the bare model); heads (``lm_head``, ``score``) are dropped. The
    shared sine frequency is stored once (under any odd ``implicit_filter`` index);
    it is copied to every index that shares it, and copies that disagree are refused.

    Raises
    ------
    CheckpointError
        Two stored copies of a layer's shared frequency differ.
    """
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.startswith(("lm_head.", "score.")):
            continue
        for prefix in ("hyena.backbone.", "backbone."):
            if name.startswith(prefix):
                name = name.removeprefix(prefix)
                break
        out[name] = tensor
    if not arch.train_freq:
        return out
    odd = range(1, 2 * (arch.num_inner_mlps + 1), 2)
    for i in range(arch.n_layer):
        names = [f"layers.{i}.mixer.filter_fn.implicit_filter.{j}.freq" for j in odd]
        stored = [n for n in names if n in out]
        if not stored:
            continue  # the strict load names the missing tensor
        first = out[stored[0]]
        for other in stored[1:]:
            if out[other].shape != first.shape or not torch.equal(out[other], first):
                msg = (
                    f"{where}: {stored[0]} and {other} are one shared sine frequency "
                    "in HyenaDNA but hold different values"
                )
                raise CheckpointError(msg)
        for n in names:
            out[n] = first
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
    bound = 1 / math.sqrt(_SHORT_FILTER)
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
    "CONFIG_DEFAULTS",
    "HyenaArch",
    "HyenaBackbone",
    "arch_from_config",
    "init_official",
    "positional_features",
    "prepare_state",
]
