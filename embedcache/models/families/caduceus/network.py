"""Caduceus (bidirectional Mamba, optionally RC-equivariant) written directly in torch.

This follows the official ``modeling_caduceus.py`` / ``modeling_rcps.py`` of
kuleshov-group/caduceus (see docs/caduceus.md for the revision) and the Mamba block
of mamba_ssm 1.2, and loads their state dicts unchanged. It is not a port of their
modules: the computation is rearranged for speed where the result is the same.

- The reverse Mamba of each layer does not flip its input: it runs an anti-causal
  convolution and a scan that walks time backwards on the unflipped sequence.
- With tied projections (the published setting) ``in_proj`` is computed once for both
  directions and ``out_proj`` once on the sum of both directions' outputs.
- The RC-equivariant (ps) model keeps its two channel halves as two "frames" stacked on
  the batch axis: frame 0 is the first half, frame 1 the second half flipped along
  length and channels, i.e. the reverse-complement strand in its own orientation. The
  official fused add+norm path hands each half to the other at every layer (the
  final norm does not); in frames that is a swap of the two batch halves plus a flip.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from embedcache.errors import CheckpointError
from embedcache.models.families.caduceus.weights import (
    CaduceusArch,
    CaduceusWeights,
    LayerWeights,
    MambaWeights,
    arch_from_config,
    kernel_params,
    to_device,
    weights_from_state_dict,
)
from embedcache.models.shared.char_tokens import BASE_IDS, UNK_ID

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

_COMPLEMENT_IDS = {7: 10, 8: 9, 9: 8, 10: 7}


class CaduceusBackbone:
    """Inference-only Caduceus backbone over loaded weights.

    Parameters
    ----------
    arch, weights
        From :func:`arch_from_config` and :func:`weights_from_state_dict`.
    device
        Torch device string.
    matmul_dtype
        ``torch.float32``, or ``torch.bfloat16`` for the in, out and x projections
        (nearly all the matmul work); the residual stream, norms, convolutions, the
        dt projection and the scan state stay float32.
    kernels
        ``"numba"``: the compiled CPU kernels of :mod:`.kernels` between the
        matmuls (add+RMSNorm, conv + SiLU, dt projection + scan + gate + direction
        sum); ``"torch"``: torch ops only, any device.
    """

    def __init__(
        self,
        arch: CaduceusArch,
        weights: CaduceusWeights,
        *,
        device: str,
        matmul_dtype: torch.dtype,
        kernels: str,
    ) -> None:
        self.arch = arch
        self.device = device
        self.matmul_dtype = matmul_dtype
        self.kernels = kernels
        self.weights = to_device(weights, device=device, matmul_dtype=matmul_dtype)
        self._kernel_params = (
            [kernel_params(layer) for layer in self.weights.layers]
            if kernels == "numba"
            else []
        )
        self._scan_kernel = self._choose_scan() if kernels == "numba" else None

    def _choose_scan(self) -> Callable[..., None]:
        """The scan kernel the machine's tuner picks among equal-vector candidates."""
        import torch

        from embedcache.models.families.caduceus.scan_blocked import choose_kernel
        from embedcache.models.shared.tuning import process_tuner

        arch = self.arch
        return choose_kernel(
            d_state=arch.d_state,
            d_inner=arch.d_inner,
            dt_rank=arch.dt_rank,
            bf16=self.matmul_dtype == torch.bfloat16,
            tuner=process_tuner(),
        )

    # -- pieces -----------------------------------------------------------------

    def _norm(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        import torch.nn.functional as F

        if self.arch.rms_norm:
            # x * rsqrt(mean(x^2) + eps) * weight, as mamba_ssm's rms_norm_ref, fused
            out = F.rms_norm(x, x.shape[-1:], weight=weight, eps=self.arch.norm_eps)
            return out + bias if bias is not None else out
        return F.layer_norm(
            x, x.shape[-1:], weight=weight, bias=bias, eps=self.arch.norm_eps
        )

    def _linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        import torch
        import torch.nn.functional as F

        out = F.linear(x.to(weight.dtype), weight)
        out = out.to(torch.float32)
        return out + bias if bias is not None else out

    def _conv(self, x: torch.Tensor, w: MambaWeights, *, reverse: bool) -> torch.Tensor:
        """Depthwise conv over time, causal (forward) or anti-causal (reverse), then SiLU."""
        import torch.nn.functional as F

        k = w.conv_w.shape[1]
        length = x.shape[1]
        if reverse:
            padded = F.pad(x, (0, 0, 0, k - 1))
            taps = [padded[:, k - 1 - j : k - 1 - j + length] for j in range(k)]
        else:
            padded = F.pad(x, (0, 0, k - 1, 0))
            taps = [padded[:, j : j + length] for j in range(k)]
        out = taps[0] * w.conv_w[:, 0]
        for j in range(1, k):
            out = out + taps[j] * w.conv_w[:, j]
        if w.conv_b is not None:
            out = out + w.conv_b
        return F.silu(out)

    def _ssm_inputs(self, x: torch.Tensor, w: MambaWeights) -> tuple[torch.Tensor, ...]:
        import torch
        import torch.nn.functional as F

        arch = self.arch
        dbl = self._linear(x, w.x_w, None)
        dt, b, c = torch.split(dbl, [arch.dt_rank, arch.d_state, arch.d_state], dim=-1)
        delta = F.softplus(F.linear(dt, w.dt_w) + w.dt_b)
        return delta, b, c

    def _mixer(self, hidden: torch.Tensor, index: int) -> torch.Tensor:
        """Bidirectional Mamba of layer ``index`` on (G, L, d) float32."""
        if self.kernels == "numba":
            return self._mixer_numba(hidden, index)
        return self._mixer_torch(hidden, self.weights.layers[index])

    def _mixer_numba(self, hidden: torch.Tensor, index: int) -> torch.Tensor:
        """The CPU path: matmuls in torch, everything between them in numba kernels.

        In bfloat16 the kernels read and write bfloat16 bits directly, so no tensor
        between two matmuls is ever converted by a separate pass.
        """
        import torch

        from embedcache.models.families.caduceus import kernels
        from embedcache.models.shared.linear import project
        from embedcache.models.shared.tuning import process_tuner

        arch = self.arch
        layer = self.weights.layers[index]
        params = self._kernel_params[index]
        n_seq, length = hidden.shape[:2]
        r, n, di = arch.dt_rank, arch.d_state, arch.d_inner
        dirs = [layer.fwd] + ([layer.rev] if layer.rev is not None else [])
        bf16 = self.matmul_dtype == torch.bfloat16

        def bits(t: torch.Tensor) -> np.ndarray:
            return (t.view(torch.int16) if bf16 else t).numpy()

        tuner = process_tuner()

        def linear(what: str, p: int, x: torch.Tensor) -> torch.Tensor:
            # the tuned implementation (shared.linear): MKL's sgemm or oneDNN's
            return project(params[what][p], x, tuner=tuner)

        def in_proj(p: int) -> torch.Tensor:
            w = dirs[p]
            xz = linear("in", p, hidden.to(w.in_w.dtype))
            return xz + w.in_b.to(xz.dtype) if w.in_b is not None else xz

        def branch(p: int, xz: torch.Tensor) -> tuple[torch.Tensor, ...]:
            u = torch.empty((n_seq, length, di))
            u_mm = torch.empty(
                (n_seq, length, di) if bf16 else (0, 0, 0), dtype=torch.bfloat16
            )
            kernels.conv_silu(
                bits(xz),
                params["conv_w"][p],
                params["conv_b"][p],
                p == 1,
                u.numpy(),
                u_mm.view(torch.int16).numpy(),
            )
            dbl = linear("x", p, u_mm if bf16 else u).float()
            # dt_proj, its bias and the softplus are applied in the scan kernel
            return u, dbl[..., :r], dbl[..., r : r + n], dbl[..., r + n :]

        def scan(ps: list[int], xz: torch.Tensor) -> torch.Tensor:
            parts = [branch(p, xz) for p in ps]
            y = torch.empty((n_seq, length, di), dtype=self.matmul_dtype)
            sl = slice(ps[0], ps[-1] + 1)
            self._scan_kernel(
                *(tuple(part[i].numpy() for part in parts) for i in range(4)),
                params["a_log2"][sl],
                params["d"][sl],
                params["dt_w"][sl],
                params["dt_bias"][sl],
                params["reverse"][sl],
                bits(xz),
                bits(y),
            )
            return y

        def out_proj(y: torch.Tensor, p: int, n_bias: int) -> torch.Tensor:
            out = linear("out", p, y).float()
            return out + n_bias * dirs[p].out_b if dirs[p].out_b is not None else out

        if layer.tied and (len(dirs) == 1 or arch.strategy == "add"):
            # one in_proj for both directions and one out_proj on their sum
            y = scan(list(range(len(dirs))), in_proj(0))
            if layer.fwd.out_b is None:
                # left in the matmul dtype: the next add+norm kernel reads bfloat16
                return linear("out", 0, y)
            return out_proj(y, 0, len(dirs))
        outs = [out_proj(scan([p], in_proj(p)), p, 1) for p in range(len(dirs))]
        if len(outs) == 1:
            return outs[0]
        return outs[0] + outs[1] if arch.strategy == "add" else outs[0] * outs[1]

    def _mixer_torch(self, hidden: torch.Tensor, layer: LayerWeights) -> torch.Tensor:
        """Bidirectional Mamba on (G, L, d) float32."""
        import torch
        import torch.nn.functional as F

        arch = self.arch
        di = arch.d_inner
        dirs = [(layer.fwd, False)] + (
            [(layer.rev, True)] if layer.rev is not None else []
        )
        if layer.tied:
            xz = self._linear(hidden, layer.fwd.in_w, layer.fwd.in_b)
            xzs = [xz, xz]
        else:
            xzs = [self._linear(hidden, w.in_w, w.in_b) for w, _ in dirs]
        us, deltas, bs, cs = [], [], [], []
        for (w, reverse), xz in zip(dirs, xzs, strict=False):
            u = self._conv(xz[..., :di], w, reverse=reverse)
            delta, b, c = self._ssm_inputs(u, w)
            us.append(u)
            deltas.append(delta)
            bs.append(b)
            cs.append(c)
        from embedcache.models.families.caduceus.scan import scan_torch

        y = scan_torch(
            torch.stack(us),
            torch.stack(deltas),
            torch.stack(bs),
            torch.stack(cs),
            torch.stack([w.a for w, _ in dirs]),
            torch.stack([w.d for w, _ in dirs]),
            reverse=tuple(r for _, r in dirs),
        ).to(hidden.device)
        gated = [y[i] * F.silu(xzs[i][..., di:]) for i in range(len(dirs))]
        if len(dirs) == 1:
            return self._linear(gated[0], layer.fwd.out_w, layer.fwd.out_b)
        if arch.strategy == "add" and layer.tied:
            out = self._linear(gated[0] + gated[1], layer.fwd.out_w, None)
            return out + 2 * layer.fwd.out_b if layer.fwd.out_b is not None else out
        outs = [
            self._linear(g, w.out_w, w.out_b)
            for g, (w, _) in zip(gated, dirs, strict=True)
        ]
        return outs[0] + outs[1] if arch.strategy == "add" else outs[0] * outs[1]

    @staticmethod
    def _swap_frames(x: torch.Tensor) -> torch.Tensor:
        """Official fused RCPS add+norm: each half goes to the other, flipped."""
        import torch

        half = x.shape[0] // 2
        return torch.cat([x[half:], x[:half]]).flip(dims=(1, 2))

    # -- forward ------------------------------------------------------------------

    def final_hidden(
        self, ids: torch.Tensor, *, streams: dict[int, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """Final-norm output for token ids (G, L): (G, L, d), or (2G, L, d) frames for ps.

        ``streams``: a dict whose keys are layers (0 = embedding output, i = the
        residual stream after block i, before any norm); each is filled with its mean
        over tokens, (G, d). Only for ph: the ps frames swap at every block.
        """
        import torch

        w = self.weights
        if streams and self.arch.rcps:
            msg = "intermediate layers of Caduceus-ps are not supported; use the last (-1)"
            raise CheckpointError(msg)
        if self.arch.rcps:
            rc_ids = w.complement[ids.flip(-1)]
            hidden = torch.cat([w.embedding[ids], w.embedding[rc_ids]])
        else:
            hidden = w.embedding[ids]
        taps = streams if streams is not None else {}
        if self.kernels == "numba" and self.arch.rms_norm:
            return self._final_hidden_numba(hidden, taps)
        residual = None
        swap = self.arch.rcps and self.arch.fused_add_norm
        for index, layer in enumerate(w.layers):
            residual = hidden if residual is None else hidden + residual
            if index in taps:  # the stream after `index` blocks
                taps[index] = residual.mean(dim=1)
            if swap:
                residual = self._swap_frames(residual)
            hidden = self._mixer(
                self._norm(residual, layer.norm_w, layer.norm_b), index
            )
        if self.arch.n_layer in taps:
            taps[self.arch.n_layer] = (hidden + residual).mean(dim=1)
        return self._norm(hidden + residual, w.norm_w, w.norm_b)

    def _final_hidden_numba(
        self, hidden: torch.Tensor, taps: dict[int, torch.Tensor]
    ) -> torch.Tensor:
        """:meth:`final_hidden` with each add+RMSNorm as one numba pass (CPU)."""
        import torch

        from embedcache.models.families.caduceus import kernels

        def bits(t: torch.Tensor) -> np.ndarray:
            return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()

        w = self.weights
        swap = self.arch.rcps and self.arch.fused_add_norm
        residual = torch.empty((0, 0, 0))
        for index, layer in enumerate(w.layers):
            res_out = torch.empty((*hidden.shape[:2], self.arch.d_model))
            normed = torch.empty(res_out.shape, dtype=self.matmul_dtype)
            kernels.add_rms_norm(
                bits(hidden),
                residual.numpy(),
                layer.norm_w.numpy(),
                self.arch.norm_eps,
                swap,
                res_out.numpy(),
                bits(normed),
            )
            residual = res_out
            if index in taps:  # the stream after `index` blocks
                taps[index] = residual.mean(dim=1)
            hidden = self._mixer(normed, index)
        out = torch.empty(residual.shape)
        stream = torch.empty(residual.shape)
        kernels.add_rms_norm(
            bits(hidden),
            residual.numpy(),
            w.norm_w.numpy(),
            self.arch.norm_eps,
            False,
            stream.numpy(),
            out.numpy(),
        )
        if self.arch.n_layer in taps:
            taps[self.arch.n_layer] = stream.mean(dim=1)
        return out

    def pooled_layers(self, ids: torch.Tensor, layers: tuple[int, ...]) -> torch.Tensor:
        """Mean over tokens of each layer (-1: the final-norm output): (len(layers), G, d).

        Intermediate layers (0 = embeddings, i = residual stream after block i) exist
        for ph only; ps gives -1 alone.
        """
        import torch

        if layers == (-1,):
            return self.pooled(ids)[None]
        streams: dict[int, torch.Tensor] = {i: ids for i in layers if i != -1}
        final = self.final_hidden(ids, streams=streams).mean(dim=1)
        return torch.stack([final if i == -1 else streams[i] for i in layers])

    def pooled(self, ids: torch.Tensor) -> torch.Tensor:
        """Mean over tokens of the final-norm output: (G, d) for ph, (G, 2d) for ps."""
        import torch

        mean = self.final_hidden(ids).mean(dim=1)
        if not self.arch.rcps:
            return mean
        n = ids.shape[0]
        # official channel layout: [forward half, second half flipped back along channels]
        return torch.cat([mean[:n], mean[n:].flip(dims=(-1,))], dim=-1)


def complement_ids(ids: torch.Tensor) -> torch.Tensor:
    """Reverse complement of token ids (..., L) in the official vocabulary."""
    import torch

    table = torch.arange(
        max(BASE_IDS.values()) + 1, dtype=torch.long, device=ids.device
    )
    for src, dst in _COMPLEMENT_IDS.items():
        table[src] = dst
    return table[ids.flip(-1)]


__all__ = [
    "BASE_IDS",
    "UNK_ID",
    "CaduceusArch",
    "CaduceusBackbone",
    "CaduceusWeights",
    "LayerWeights",
    "MambaWeights",
    "arch_from_config",
    "complement_ids",
    "weights_from_state_dict",
]
