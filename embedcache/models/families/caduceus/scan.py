"""The selective scan in torch ops, for any device (the CPU kernel is in .kernels).

For each direction p, sequence g and channel (time runs backwards when ``reverse[p]``)::

    s_t = exp(delta_t * A) * s_{t-1} + delta_t * u_t * B_t      (state: d_state floats)
    y_t = <s_t, C_t> + D * u_t

``delta`` arrives already softplus-ed and the ``silu(z)`` gate is applied by the caller.
The state is always float32.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

_TIME_CHUNK = 64


def scan_torch(
    u: torch.Tensor,
    delta: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    a: torch.Tensor,
    d: torch.Tensor,
    *,
    reverse: tuple[bool, ...],
) -> torch.Tensor:
    """Scan in torch ops on any device: a loop over time, vectorised over the rest.

    Parameters
    ----------
    u, delta
        (P, G, L, Di) float32: P directions, G sequences, L tokens, Di channels.
    b, c
        (P, G, L, N) float32.
    a, d
        (P, Di, N) and (P, Di) float32; ``a`` is ``-exp(A_log)``.
    reverse
        Per direction, whether time runs from L-1 down to 0.

    Returns
    -------
    torch.Tensor
        (P, G, L, Di) float32.
    """
    import torch

    n_seq, length = u.shape[1], u.shape[2]
    out = torch.empty_like(u)
    for p in range(u.shape[0]):
        state = u.new_zeros((n_seq, u.shape[-1], a.shape[-1]))
        starts = range(0, length, _TIME_CHUNK)
        for t0 in reversed(starts) if reverse[p] else starts:
            t1 = min(t0 + _TIME_CHUNK, length)
            # (G, T, Di, N) per chunk of time: one exp per state element, as the
            # official reference does, without holding (G, L, Di, N) at once
            decay = torch.exp(delta[p, :, t0:t1].unsqueeze(-1) * a[p])
            drive = (delta[p, :, t0:t1] * u[p, :, t0:t1]).unsqueeze(-1) * b[
                p, :, t0:t1
            ].unsqueeze(-2)
            steps = range(t1 - t0 - 1, -1, -1) if reverse[p] else range(t1 - t0)
            for i in steps:
                state = decay[:, i] * state + drive[:, i]
                out[p, :, t0 + i] = torch.einsum("gdn,gn->gd", state, c[p, :, t0 + i])
        out[p] += u[p] * d[p]
    return out
