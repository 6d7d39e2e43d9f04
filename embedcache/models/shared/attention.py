"""Multi-head attention with the implementation chosen per machine (see ``tuning``).

Candidates, all on a boolean key mask (True: the query may see that key):

- ``flash``: ``F.scaled_dot_product_attention``, PyTorch's fused CPU (flash) kernel;
  the reference, and what ran before the tuner;
- ``math``: two batched matmuls in the compute dtype with the softmax in float32. On
  AMX CPUs the flash kernel in bf16 took longer than all linear layers together,
  while bf16 matmuls are nearly free there; on AVX2 it is the other way round.

On CUDA the same two run as CUDA candidates, tuned per device kind (the problem's
shape names the device); not measured here (no GPU on the machines we had).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from embedcache.models.shared.tuning import Candidate, Problem, length_bucket

if TYPE_CHECKING:
    import torch

    from embedcache.models.shared.tuning import Tuner


def attend_flash(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor | None
) -> torch.Tensor:
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q, k, v, attn_mask=keys)


def attend_math(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor | None
) -> torch.Tensor:
    import torch

    scale = q.shape[-1] ** -0.5
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    if keys is not None:
        scores = scores.masked_fill(~keys, float("-inf"))
    return torch.matmul(scores.softmax(dim=-1).to(v.dtype), v)


CANDIDATES = {"flash": attend_flash, "math": attend_math}
# the math path holds (batch, heads, L, L) float32 scores: offered up to this length
MATH_MAX_LENGTH = 512


def synthetic_inputs(
    *, n_heads: int, length: int, head_dim: int, dtype: torch.dtype, device: str
) -> tuple[torch.Tensor, ...]:
    """q, k, v (4, heads, length, head_dim) and a key mask with padded rows."""
    import torch

    gen = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn((4, n_heads, length, head_dim), generator=gen).to(dtype).to(device)
        for _ in range(3)
    )
    lengths = torch.tensor([length, max(1, length // 2), max(1, length - 3), 1])
    keys = (torch.arange(length)[None, :] < lengths[:, None])[:, None, None, :]
    return q, k, v, keys.to(device)


def choose(
    *,
    tuner: Tuner,
    n_heads: int,
    length: int,
    head_dim: int,
    dtype: torch.dtype,
    device: str,
) -> str:
    """The attention candidate for this (dtype, length bucket, shape) on this machine."""
    bucket = length_bucket(length)
    bound = int(bucket.removeprefix("<="))
    problem = Problem(
        "attention",
        str(dtype).removeprefix("torch."),
        bucket,
        f"heads={n_heads},head_dim={head_dim},device={device.split(':')[0]}",
    )
    names = list(CANDIDATES) if bound <= MATH_MAX_LENGTH else ["flash"]
    return tuner.choose(
        problem,
        [
            Candidate(name, lambda args, fn=CANDIDATES[name]: fn(*args))
            for name in names
        ],
        lambda: synthetic_inputs(
            n_heads=n_heads, length=bound, head_dim=head_dim, dtype=dtype, device=device
        ),
    )


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keys: torch.Tensor | None,
    *,
    tuner: Tuner,
) -> torch.Tensor:
    """Attention of ``q`` (b, heads, t, d) over ``k``, ``v`` by the tuner's choice."""
    name = choose(
        tuner=tuner,
        n_heads=q.shape[1],
        length=k.shape[2],
        head_dim=q.shape[-1],
        dtype=q.dtype,
        device=str(q.device),
    )
    return CANDIDATES[name](q, k, v, keys)
