"""What a HyenaDNA checkpoint says: its config's architecture and its tensors' names.

The architecture is read with the published configuration class's defaults; the
state dict's names are those of the published checkpoints (``hyena.backbone.*`` or
``backbone.*``), renamed and completed for :class:`.network.HyenaBackbone`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from embedcache.errors import CheckpointError

if TYPE_CHECKING:
    from collections.abc import Mapping

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
SHORT_FILTER = 3  # the width the published code pads for (causal only at 3)


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
    if ints["short_filter_order"] != SHORT_FILTER:
        msg = (
            f"{where}: short_filter_order {ints['short_filter_order']} is not "
            f"supported; the published code pads the short filter by 2, which is "
            f"causal only for width {SHORT_FILTER}"
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


__all__ = [
    "CONFIG_DEFAULTS",
    "SHORT_FILTER",
    "HyenaArch",
    "arch_from_config",
    "prepare_state",
]
