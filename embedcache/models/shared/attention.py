"""Multi-head attention with the implementation chosen per machine (see ``tuning``).

Candidates, on a boolean key mask (True: the query may see that key; BERT, GENA-LM,
NT-v2) or an additive float bias (DNABERT-2's ALiBi, -inf at padded keys):

- ``flash``: ``F.scaled_dot_product_attention``, PyTorch's fused CPU (flash) kernel;
  the reference, and what ran before the tuner;
- ``math``: two batched matmuls in the compute dtype with the softmax in float32. On
  AMX CPUs the flash kernel in bf16 took longer than all linear layers together,
  while bf16 matmuls are nearly free there; on AVX2 it is the other way round.

On CUDA the same two run as CUDA candidates, tuned per device kind (the problem's
shape names the device); not measured here (no GPU on the machines we had).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
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
    if keys is not None and keys.dtype == torch.bool:
        scores = scores.masked_fill(~keys, float("-inf"))
    elif keys is not None:
        scores = scores + keys.float()
    return torch.matmul(scores.softmax(dim=-1).to(v.dtype), v)


CANDIDATES = {"flash": attend_flash, "math": attend_math}
# the math path holds (batch, heads, L, L) float32 scores: offered up to this length
MATH_MAX_LENGTH = 512


@dataclass(frozen=True, slots=True)
class Shape:
    """An attention problem's shape: ``length`` is the padded length of the keys;
    ``additive``: the mask is a float bias (ALiBi), not a boolean one."""

    n_heads: int
    length: int
    head_dim: int
    dtype: torch.dtype
    device: str
    additive: bool = False


def synthetic_inputs(shape: Shape) -> tuple[torch.Tensor, ...]:
    """q, k, v (4, heads, length, head_dim) and a key mask with padded rows; with
    ``additive``, an ALiBi-like float bias (4, heads, length, length) in ``dtype``,
    -inf at the padded keys, instead."""
    import torch

    length, n_heads = shape.length, shape.n_heads
    gen = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn((4, n_heads, length, shape.head_dim), generator=gen)
        .to(shape.dtype)
        .to(shape.device)
        for _ in range(3)
    )
    lengths = torch.tensor([length, max(1, length // 2), max(1, length - 3), 1])
    keys = (torch.arange(length)[None, :] < lengths[:, None])[:, None, None, :]
    if shape.additive:
        pos = torch.arange(length)
        slopes = 2.0 ** -torch.arange(1, n_heads + 1, dtype=torch.float32)
        alibi = -slopes[:, None, None] * (pos[None, :] - pos[:, None]).abs()
        keys = alibi[None].masked_fill(~keys, float("-inf")).to(shape.dtype)
    return q, k, v, keys.to(shape.device)


def choose(*, tuner: Tuner, shape: Shape) -> str:
    """The attention candidate for this (dtype, length bucket, shape, mask kind) on
    this machine."""
    bucket = length_bucket(shape.length)
    bound = int(bucket.removeprefix("<="))
    mask = ",mask=additive" if shape.additive else ""
    device = shape.device.split(":")[0]
    problem = Problem(
        "attention",
        str(shape.dtype).removeprefix("torch."),
        bucket,
        f"heads={shape.n_heads},head_dim={shape.head_dim},device={device}{mask}",
    )
    names = list(CANDIDATES) if bound <= MATH_MAX_LENGTH else ["flash"]
    return tuner.choose(
        problem,
        [
            Candidate(name, lambda args, fn=CANDIDATES[name]: fn(*args))
            for name in names
        ],
        lambda: synthetic_inputs(replace(shape, length=bound)),
    )


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keys: torch.Tensor | None,
    *,
    tuner: Tuner,
) -> torch.Tensor:
    """Attention of ``q`` (b, heads, t, d) over ``k``, ``v`` by the tuner's choice;
    ``keys`` a boolean mask or an additive bias, broadcast to (b, heads, t, t)."""
    additive = keys is not None and keys.is_floating_point()
    shape = Shape(q.shape[1], k.shape[2], q.shape[-1], q.dtype, str(q.device), additive)
    name = choose(tuner=tuner, shape=shape)
    return CANDIDATES[name](q, k, v, keys)
