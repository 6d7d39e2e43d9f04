"""A Caduceus checkpoint as tensors: its config's architecture and its weights.

:func:`arch_from_config` reads the shape-deciding fields of ``config.json`` with the
official defaults; :func:`weights_from_state_dict` picks, checks and converts the
tensors of an official state dict (``modeling_caduceus.py`` / ``modeling_rcps.py`` of
kuleshov-group/caduceus, Mamba blocks of mamba_ssm 1.2) into plain dataclasses, which
:mod:`.network` runs and :mod:`.init` can fill with random draws.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from embedcache.errors import CheckpointError

if TYPE_CHECKING:
    from collections.abc import Mapping

    import torch

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CaduceusArch:
    """The shape-deciding fields of a Caduceus ``config.json``."""

    d_model: int
    n_layer: int
    vocab_size: int
    d_state: int = 16
    d_conv: int = 4
    expand: int = 2
    dt_rank: int = 0
    rms_norm: bool = True
    norm_eps: float = 1e-5
    fused_add_norm: bool = True
    bidirectional: bool = True
    strategy: str = "add"
    weight_tie: bool = True
    rcps: bool = False
    conv_bias: bool = True
    proj_bias: bool = False

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model


def arch_from_config(config: Mapping[str, Any], *, where: str) -> CaduceusArch:
    """Read the architecture from a config dict, with the official defaults.

    Raises
    ------
    CheckpointError
        A field the official code would reject, or one this implementation lacks.
    """
    ssm = dict(config.get("ssm_cfg") or {})
    try:
        d_model = int(config["d_model"])
        n_layer = int(config["n_layer"])
    except (KeyError, TypeError, ValueError) as err:
        msg = f"{where}: a Caduceus config needs integer d_model and n_layer ({err})"
        raise CheckpointError(msg) from err
    vocab = int(config.get("vocab_size", 50277))
    multiple = int(config.get("pad_vocab_size_multiple", 8))
    if vocab % multiple:  # the official model pads the vocabulary the same way
        vocab += multiple - vocab % multiple
    dt_rank = ssm.get("dt_rank", "auto")
    dt_rank = math.ceil(d_model / 16) if dt_rank == "auto" else int(dt_rank)
    bidirectional = bool(config.get("bidirectional", True))
    strategy = config.get("bidirectional_strategy", "add") or "add"
    if bidirectional and strategy not in {"add", "ew_multiply"}:
        msg = f"{where}: bidirectional_strategy {strategy!r} is not one of 'add', 'ew_multiply'"
        raise CheckpointError(msg)
    rcps = bool(config.get("rcps", False))
    if rcps and not config.get("complement_map"):
        msg = f"{where}: an rcps (Caduceus-ps) config needs a complement_map"
        raise CheckpointError(msg)
    return CaduceusArch(
        d_model=d_model,
        n_layer=n_layer,
        vocab_size=vocab,
        d_state=int(ssm.get("d_state", 16)),
        d_conv=int(ssm.get("d_conv", 4)),
        expand=int(ssm.get("expand", 2)),
        dt_rank=dt_rank,
        rms_norm=bool(config.get("rms_norm", True)),
        norm_eps=float(config.get("norm_epsilon", 1e-5)),
        fused_add_norm=bool(config.get("fused_add_norm", True)),
        bidirectional=bidirectional,
        strategy=strategy,
        weight_tie=bool(config.get("bidirectional_weight_tie", True)),
        rcps=rcps,
        conv_bias=bool(ssm.get("conv_bias", True)),
        proj_bias=bool(ssm.get("bias", False)),
    )


@dataclass(slots=True)
class MambaWeights:
    """One direction's Mamba parameters (``a`` is ``-exp(A_log)``, computed once)."""

    in_w: torch.Tensor
    in_b: torch.Tensor | None
    conv_w: torch.Tensor  # (Di, K)
    conv_b: torch.Tensor | None
    x_w: torch.Tensor
    dt_w: torch.Tensor
    dt_b: torch.Tensor
    a: torch.Tensor  # (Di, N)
    d: torch.Tensor
    out_w: torch.Tensor
    out_b: torch.Tensor | None


@dataclass(slots=True)
class LayerWeights:
    norm_w: torch.Tensor
    norm_b: torch.Tensor | None
    fwd: MambaWeights
    rev: MambaWeights | None
    tied: bool  # in_proj and out_proj shared by both directions


@dataclass(slots=True)
class CaduceusWeights:
    embedding: torch.Tensor
    complement: torch.Tensor | None  # ps: token id -> complement id
    layers: list[LayerWeights]
    norm_w: torch.Tensor
    norm_b: torch.Tensor | None


def weights_from_state_dict(
    arch: CaduceusArch,
    state: Mapping[str, torch.Tensor],
    *,
    config: Mapping[str, Any],
    where: str,
) -> CaduceusWeights:
    """Pick, check and convert the tensors of an official state dict.

    Tied tensors (every ``mamba_rev.in_proj``/``out_proj`` when
    ``bidirectional_weight_tie``) may be stored under either direction's name, or both.

    Raises
    ------
    CheckpointError
        A tensor that is not tied is missing, or a tensor has the wrong shape.
    """
    import torch

    from embedcache.models.shared.weights import strip_prefix

    # the ForMaskedLM prefix; the LM head is tied to the embedding and not used
    tensors = strip_prefix(state, "caduceus.", ignore=("lm_head.",))
    used: set[str] = set()

    def take(
        *names: str, shape: tuple[int, ...] | None, optional: bool = False
    ) -> torch.Tensor | None:
        for name in names:
            if name in tensors:
                used.update(n for n in names if n in tensors)
                tensor = tensors[name].detach().to(torch.float32)
                if shape is not None and tuple(tensor.shape) != shape:
                    msg = (
                        f"{where}: tensor {name!r} has shape {tuple(tensor.shape)}, the config "
                        f"implies {shape}; the checkpoint and its config.json do not match"
                    )
                    raise CheckpointError(msg)
                return tensor
        if optional:
            return None
        msg = (
            f"{where}: the checkpoint has no tensor {names[0]!r}"
            + (f" (nor its tied twin {names[1]!r})" if len(names) > 1 else "")
            + "; the weights file is incomplete or belongs to another architecture"
        )
        raise CheckpointError(msg)

    d, di, n, r, k = arch.d_model, arch.d_inner, arch.d_state, arch.dt_rank, arch.d_conv
    pre = "backbone."
    emb_name = (
        pre
        + "embeddings.word_embeddings."
        + ("embedding.weight" if arch.rcps else "weight")
    )
    embedding = take(emb_name, shape=None)
    if embedding.ndim != 2 or embedding.shape[1] != d:
        msg = f"{where}: tensor {emb_name!r} has shape {tuple(embedding.shape)}, expected (vocab, {d})"
        raise CheckpointError(msg)

    complement = None
    if arch.rcps:
        buf = pre + "embeddings.word_embeddings.complement_map"
        if buf in tensors:
            complement = tensors[buf].to(torch.long)
            used.add(buf)
        else:
            cmap = {int(key): int(val) for key, val in config["complement_map"].items()}
            complement = torch.tensor(
                [cmap.get(i, i) for i in range(embedding.shape[0])], dtype=torch.long
            )
        if complement.shape[0] < embedding.shape[0]:
            msg = f"{where}: complement_map has {complement.shape[0]} entries for {embedding.shape[0]} tokens"
            raise CheckpointError(msg)

    def mamba(prefix: str, twin: str | None) -> MambaWeights:
        def tied(name: str) -> tuple[str, ...]:
            return (
                (prefix + name, twin + name) if twin is not None else (prefix + name,)
            )

        bias = arch.proj_bias
        return MambaWeights(
            in_w=take(*tied("in_proj.weight"), shape=(2 * di, d)),
            in_b=take(*tied("in_proj.bias"), shape=(2 * di,)) if bias else None,
            conv_w=take(prefix + "conv1d.weight", shape=(di, 1, k)).reshape(di, k),
            conv_b=take(prefix + "conv1d.bias", shape=(di,))
            if arch.conv_bias
            else None,
            x_w=take(prefix + "x_proj.weight", shape=(r + 2 * n, di)),
            dt_w=take(prefix + "dt_proj.weight", shape=(di, r)),
            dt_b=take(prefix + "dt_proj.bias", shape=(di,)),
            a=-torch.exp(take(prefix + "A_log", shape=(di, n))),
            d=take(prefix + "D", shape=(di,)),
            out_w=take(*tied("out_proj.weight"), shape=(d, di)),
            out_b=take(*tied("out_proj.bias"), shape=(d,)) if bias else None,
        )

    def norm(prefix: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        # RCPSAddNormWrapper (rcps without fused add+norm) nests the norm in .submodule
        if arch.rcps and not arch.fused_add_norm:
            prefix += "submodule."
        weight = take(prefix + "weight", shape=(d,))
        bias = None if arch.rms_norm else take(prefix + "bias", shape=(d,))
        return weight, bias

    layers = []
    tie = arch.bidirectional and arch.weight_tie
    for i in range(arch.n_layer):
        mixer = f"{pre}layers.{i}.mixer." + ("submodule." if arch.rcps else "")
        fwd_p, rev_p = mixer + "mamba_fwd.", mixer + "mamba_rev."
        fwd = mamba(fwd_p, rev_p if tie else None)
        rev = mamba(rev_p, fwd_p if tie else None) if arch.bidirectional else None
        norm_w, norm_b = norm(f"{pre}layers.{i}.norm.")
        layers.append(
            LayerWeights(norm_w=norm_w, norm_b=norm_b, fwd=fwd, rev=rev, tied=tie)
        )
    norm_w, norm_b = norm(pre + "norm_f.")

    unused = sorted(set(tensors) - used)
    if unused:
        logger.warning(
            "%s: %d tensors not used by the Caduceus backbone, e.g. %s",
            where,
            len(unused),
            unused[:3],
        )
    return CaduceusWeights(
        embedding=embedding,
        complement=complement,
        layers=layers,
        norm_w=norm_w,
        norm_b=norm_b,
    )


def kernel_params(layer: LayerWeights) -> dict[str, Any]:
    """Numpy views of one layer's parameters in the layouts the numba kernels take,
    and its projections as :class:`.linear.Dense` (per direction: "in", "x", "out")."""
    import numpy as np
    import torch

    from embedcache.models.shared.linear import Dense

    dirs = [layer.fwd] + ([layer.rev] if layer.rev is not None else [])
    return {
        "in": [Dense(w.in_w) for w in dirs],
        "x": [Dense(w.x_w) for w in dirs],
        "out": [Dense(w.out_w) for w in dirs],
        "conv_w": [w.conv_w.t().contiguous().numpy() for w in dirs],
        "conv_b": [
            (
                w.conv_b if w.conv_b is not None else torch.zeros(w.conv_w.shape[0])
            ).numpy()
            for w in dirs
        ],
        # exp(delta * A) is computed as 2**(delta * A * log2(e))
        "a_log2": torch.stack([w.a.t() / math.log(2.0) for w in dirs])
        .contiguous()
        .numpy(),
        "d": torch.stack([w.d for w in dirs]).contiguous().numpy(),
        "dt_w": torch.stack([w.dt_w.t() for w in dirs]).contiguous().numpy(),
        "dt_bias": torch.stack([w.dt_b for w in dirs]).contiguous().numpy(),
        "reverse": np.array([False, True][: len(dirs)]),
    }


def to_device(
    weights: CaduceusWeights, *, device: str, matmul_dtype: torch.dtype
) -> CaduceusWeights:
    """``weights`` on ``device``: the in, x and out projections in ``matmul_dtype``,
    the rest float32, every tensor contiguous."""
    import torch

    def mv(
        t: torch.Tensor | None, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor | None:
        return None if t is None else t.to(device=device, dtype=dtype).contiguous()

    def mamba(m: MambaWeights | None) -> MambaWeights | None:
        if m is None:
            return None
        return MambaWeights(
            in_w=mv(m.in_w, matmul_dtype),
            in_b=mv(m.in_b),
            conv_w=mv(m.conv_w),
            conv_b=mv(m.conv_b),
            x_w=mv(m.x_w, matmul_dtype),
            dt_w=mv(m.dt_w),
            dt_b=mv(m.dt_b),
            a=mv(m.a),
            d=mv(m.d),
            out_w=mv(m.out_w, matmul_dtype),
            out_b=mv(m.out_b),
        )

    return CaduceusWeights(
        embedding=mv(weights.embedding),
        complement=None
        if weights.complement is None
        else weights.complement.to(device),
        layers=[
            LayerWeights(
                norm_w=mv(layer.norm_w),
                norm_b=mv(layer.norm_b),
                fwd=mamba(layer.fwd),
                rev=mamba(layer.rev),
                tied=layer.tied,
            )
            for layer in weights.layers
        ],
        norm_w=mv(weights.norm_w),
        norm_b=mv(weights.norm_b),
    )


__all__ = [
    "CaduceusArch",
    "CaduceusWeights",
    "LayerWeights",
    "MambaWeights",
    "arch_from_config",
    "kernel_params",
    "to_device",
    "weights_from_state_dict",
]
