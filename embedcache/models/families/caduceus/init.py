"""Seeded random Caduceus weights drawn as the family's own initialisation does.

A random-init twin is the architecture without pretraining: the same config, weights
drawn from the distributions the official model starts training from, so comparing
it with the trained checkpoint measures what pretraining adds. The distributions
follow ``CaduceusPreTrainedModel._init_weights`` (kuleshov-group/caduceus) and the
Mamba block's constructor (mamba_ssm 1.2), per layer and direction:

- embedding: normal, std ``initializer_cfg.initializer_range`` (0.02);
- in_proj, x_proj: PyTorch's default Linear init, uniform(+-1/sqrt(fan_in)); in_proj's
  bias (if any) zero;
- conv1d (depthwise): PyTorch's default Conv1d init, weight and bias
  uniform(+-1/sqrt(d_conv));
- dt_proj: weight uniform(+-dt_rank**-0.5); bias the inverse softplus of dt drawn
  log-uniformly in [0.001, 0.1] and floored at 1e-4;
- A_log = log(1..d_state) for every channel; D = 1;
- out_proj: uniform(+-1/sqrt(d_inner)) divided by sqrt(n_residuals_per_layer * n_layer)
  (the prenorm-residual rescaling, on by default); its bias (if any) zero;
- norms: weight 1 (bias 0 for LayerNorm);
- tied directions share in_proj and out_proj, as the official model ties them.

The draws come from one ``torch.Generator`` seeded with the seed, in a fixed order,
so a seed always gives the same weights on every machine (CPU generator); the exact
stream of the official code (which draws module by module at construction) is not
reproduced, only its distributions.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from embedcache.models.families.caduceus.weights import (
    CaduceusWeights,
    LayerWeights,
    MambaWeights,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    import torch

    from embedcache.models.families.caduceus.weights import CaduceusArch

DT_MIN, DT_MAX, DT_FLOOR = 1e-3, 1e-1, 1e-4
INITIALIZER_RANGE = 0.02


def random_weights(
    arch: CaduceusArch, config: Mapping[str, Any], *, seed: int
) -> CaduceusWeights:
    """Caduceus weights for ``arch`` drawn with ``seed`` (see the module docstring)."""
    import torch

    gen = torch.Generator().manual_seed(int(seed))
    init = dict(config.get("initializer_cfg") or {})
    std = float(init.get("initializer_range", INITIALIZER_RANGE))
    rescale = bool(init.get("rescale_prenorm_residual", True))
    n_residuals = int(init.get("n_residuals_per_layer", 1))
    d, di, n, r, k = arch.d_model, arch.d_inner, arch.d_state, arch.dt_rank, arch.d_conv

    def uniform(shape: tuple[int, ...], bound: float) -> torch.Tensor:
        return (torch.rand(shape, generator=gen) * 2 - 1) * bound

    def mamba(shared: MambaWeights | None) -> MambaWeights:
        if shared is None:
            in_w = uniform((2 * di, d), 1 / math.sqrt(d))
            out_w = uniform((d, di), 1 / math.sqrt(di))
            if rescale:
                out_w = out_w / math.sqrt(n_residuals * arch.n_layer)
        else:
            in_w, out_w = shared.in_w, shared.out_w
        conv_w = uniform((di, k), 1 / math.sqrt(k))
        conv_b = uniform((di,), 1 / math.sqrt(k)) if arch.conv_bias else None
        x_w = uniform((r + 2 * n, di), 1 / math.sqrt(di))
        dt_w = uniform((di, r), r**-0.5)
        log_dt = torch.rand((di,), generator=gen) * (
            math.log(DT_MAX) - math.log(DT_MIN)
        ) + math.log(DT_MIN)
        dt = torch.exp(log_dt).clamp(min=DT_FLOOR)
        dt_b = dt + torch.log(-torch.expm1(-dt))  # inverse of softplus
        a_log = torch.log(torch.arange(1, n + 1, dtype=torch.float32)).repeat(di, 1)
        bias = torch.zeros(2 * di) if arch.proj_bias else None
        return MambaWeights(
            in_w=in_w,
            in_b=bias,
            conv_w=conv_w,
            conv_b=conv_b,
            x_w=x_w,
            dt_w=dt_w,
            dt_b=dt_b,
            a=-torch.exp(a_log),
            d=torch.ones(di),
            out_w=out_w,
            out_b=torch.zeros(d) if arch.proj_bias else None,
        )

    embedding = torch.randn((arch.vocab_size, d), generator=gen) * std
    complement = None
    if arch.rcps:
        cmap = {int(a): int(b) for a, b in (config.get("complement_map") or {}).items()}
        complement = torch.tensor(
            [cmap.get(i, i) for i in range(arch.vocab_size)], dtype=torch.long
        )
    tie = arch.bidirectional and arch.weight_tie
    layers = []
    for _ in range(arch.n_layer):
        fwd = mamba(None)
        rev = mamba(fwd if tie else None) if arch.bidirectional else None
        layers.append(
            LayerWeights(
                norm_w=torch.ones(d),
                norm_b=None if arch.rms_norm else torch.zeros(d),
                fwd=fwd,
                rev=rev,
                tied=tie,
            )
        )
    return CaduceusWeights(
        embedding=embedding,
        complement=complement,
        layers=layers,
        norm_w=torch.ones(d),
        norm_b=None if arch.rms_norm else torch.zeros(d),
    )
