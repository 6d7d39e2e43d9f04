"""A linear layer (and the activation after it) by the implementation chosen per
machine (see ``tuning``).

Candidates, for ``y = act(x W^T + b)``:

- ``aten``: ``F.linear`` then the activation; the reference, what ran before. On CPU
  ``F.linear`` with a bias is ``addmm``, which first copies the bias into every row
  of the output and then accumulates the product onto it: that copy was 10.6% of
  a BERT 512x8 bf16 batch on an AMX CPU (the profile of issue 43);
- ``onednn``: oneDNN's linear with the bias, and GELU where asked, applied to the
  accumulator (``mkldnn._linear_pointwise``): no bias copy, no separate GELU pass.
  Its GELU reads the float32 accumulator instead of the output rounded to bf16, so
  in bf16 its output differs from ``aten``'s by ~5e-3 of the output's scale (within
  bf16's tolerance); without an activation it gives ``aten``'s bf16 bits (measured);
  in float32 it is oneDNN's sgemm instead of MKL's (~1e-6 relative);
- ``onednn-packed``: the same with the weight reordered once into oneDNN's blocked
  layout (at first use, kept beside the module's weight), not on every call.

The oneDNN candidates exist on CPU builds of torch with mkldnn, for float32 and
bfloat16; elsewhere (CUDA, float16) ``aten`` is the only candidate. The problem's key
names the layer's shape, the activation and the dtype, not the number of rows: the
choice must not depend on the batch, or a sequence's vector would (each candidate
gives a row the same bits whatever the rows around it, checked on 16-2,048 rows in
tests/models/test_linear.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F

from embedcache.models.shared.tuning import Candidate, Problem

if TYPE_CHECKING:
    from collections.abc import Callable

    from embedcache.models.shared.tuning import Tuner


class Weighted(Protocol):
    """What a candidate takes: an ``nn.Linear``, or a :class:`Dense`."""

    weight: torch.Tensor
    bias: torch.Tensor | None


@dataclass(eq=False)
class Dense:
    """A weight (out, in) and bias held outside an ``nn.Linear``: a family's own
    weight tensors. Not frozen: :func:`packed_weight` keeps its reordered weight on it."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "none": lambda y: y,
    "gelu": F.gelu,  # exact (erf), BERT's hidden_act "gelu"
}
# oneDNN's name and algorithm for each activation
_ONEDNN_ATTR = {"none": ("none", ""), "gelu": ("gelu", "none")}
# rows of the synthetic input the candidates are timed on: a full batch at the
# default token budget
TUNING_ROWS = 1536
_PACKED = "_embedcache_packed"


def run_aten(linear: Weighted, x: torch.Tensor, activation: str) -> torch.Tensor:
    return ACTIVATIONS[activation](F.linear(x, linear.weight, linear.bias))


def run_onednn(linear: Weighted, x: torch.Tensor, activation: str) -> torch.Tensor:
    attr, algorithm = _ONEDNN_ATTR[activation]
    return torch.ops.mkldnn._linear_pointwise(
        x, linear.weight, linear.bias, attr, [], algorithm
    )


def run_onednn_packed(
    linear: Weighted, x: torch.Tensor, activation: str
) -> torch.Tensor:
    attr, algorithm = _ONEDNN_ATTR[activation]
    return torch.ops.mkldnn._linear_pointwise(
        x, packed_weight(linear), linear.bias, attr, [], algorithm
    )


CANDIDATES = {
    "aten": run_aten,
    "onednn": run_onednn,
    "onednn-packed": run_onednn_packed,
}


def packed_weight(linear: Weighted) -> torch.Tensor:
    """``linear.weight`` in oneDNN's blocked layout, reordered once and kept on the
    module; reordered again if the weight was replaced or cast since."""
    weight = linear.weight
    stamp = (weight.data_ptr(), weight.dtype, weight._version)
    kept = getattr(linear, _PACKED, None)
    if kept is None or kept[0] != stamp:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), TUNING_ROWS)
        kept = (stamp, packed)
        # a plain attribute, not a buffer: never in a state dict
        object.__setattr__(linear, _PACKED, kept)
    return kept[1]


def _onednn_fits(x: torch.Tensor) -> bool:
    return (
        x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def choose(*, tuner: Tuner, linear: Weighted, x: torch.Tensor, activation: str) -> str:
    """The linear candidate for this layer's shape, dtype and activation here."""
    n_out, n_in = linear.weight.shape
    dtype = str(x.dtype).removeprefix("torch.")
    problem = Problem(
        "linear",
        dtype,
        shape=(
            f"in={n_in},out={n_out},act={activation},"
            f"bias={linear.bias is not None},device={x.device.type}"
        ),
    )
    names = list(CANDIDATES) if _onednn_fits(x) else ["aten"]

    def make_input() -> torch.Tensor:
        gen = torch.Generator().manual_seed(0)
        rows = torch.randn((TUNING_ROWS, n_in), generator=gen)
        return rows.to(dtype=x.dtype, device=x.device)

    return tuner.choose(
        problem,
        [
            Candidate(
                name, lambda rows, fn=CANDIDATES[name]: fn(linear, rows, activation)
            )
            for name in names
        ],
        make_input,
    )


def project(
    linear: Weighted,
    x: torch.Tensor,
    *,
    tuner: Tuner,
    activation: str = "none",
) -> torch.Tensor:
    """``activation(linear(x))`` by the tuner's choice for this layer."""
    name = choose(tuner=tuner, linear=linear, x=x, activation=activation)
    return CANDIDATES[name](linear, x, activation)


__all__ = ["ACTIVATIONS", "CANDIDATES", "Dense", "project"]
