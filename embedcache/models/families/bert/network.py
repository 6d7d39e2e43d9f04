"""transformers' ``BertModel`` (post-LN BERT) in plain PyTorch, for inference.

The ``hf`` family loads a ``model_type: bert`` checkpoint here instead of through
transformers when its config asks for nothing else (:func:`native_config`): importing
transformers' modeling code pulls ``torch.distributed``, ``torch._dynamo`` and sympy,
seconds of start-up before any weight is read. Module and parameter names follow
``BertModel`` so its state dict (a ``bert.`` prefix removed) loads strictly. Embeddings
are word + token type 0 + absolute position, then LayerNorm; per block::

    x = LN1(x + Wo(attention(Wq x, Wk x, Wv x)))
    x = LN2(x + W2(gelu(W1 x)))

GELU is the exact (erf) one, ``hidden_act: gelu``; padded keys are masked.
tests/models/test_hf_bert.py compares every hidden state with ``BertModel``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from embedcache.errors import CheckpointError
from embedcache.models.shared.bert_modules import (
    Dense,
    Embeddings,
    SelfAttention,
    StackNetwork,
)
from embedcache.models.shared.config_fields import BertSizes, bert_sizes, positive_int

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

# tensors a BERT checkpoint may hold that the encoder never uses: task heads, the
# pooler (the hf family builds BertModel without it), and position/type id buffers
# that older transformers versions saved
_KEPT = ("embeddings.", "encoder.")
_UNUSED_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")


def native_config(config: Mapping[str, Any]) -> bool:
    """Whether ``BertModel`` built from ``config`` computes what :class:`BertNetwork`
    does: a ``bert`` encoder with exact GELU, absolute positions, no decoder or
    cross-attention, no pruned heads and no code of its own."""
    return (
        config.get("model_type") == "bert"
        and not config.get("auto_map")
        and config.get("hidden_act", "gelu") == "gelu"
        and config.get("position_embedding_type", "absolute") == "absolute"
        and not config.get("is_decoder", False)
        and not config.get("add_cross_attention", False)
        and not config.get("pruned_heads")
    )


@dataclass(frozen=True, slots=True)
class BertArch(BertSizes):
    """The architecture numbers of a BERT ``config.json``."""

    max_positions: int
    type_vocab_size: int
    layer_norm_eps: float


def arch_from_config(config: Mapping[str, Any], *, where: str) -> BertArch:
    """Read the fields :class:`BertNetwork` needs (BertConfig's defaults where absent).

    Raises
    ------
    CheckpointError
        The config is not :func:`native_config`, a size is missing or not a positive
        integer, or the width is not a multiple of the heads.
    """
    if not native_config(config):
        msg = f"{where}: not a plain BERT config; load it through transformers"
        raise CheckpointError(msg)
    arch = BertArch(
        **bert_sizes(config, where=where),
        max_positions=positive_int(
            config, "max_position_embeddings", where=where, default=512
        ),
        type_vocab_size=positive_int(config, "type_vocab_size", where=where, default=2),
        layer_norm_eps=float(config.get("layer_norm_eps", 1e-12)),
    )
    if arch.hidden_size % arch.n_heads:
        msg = f"{where}: hidden_size {arch.hidden_size} is not a multiple of {arch.n_heads} heads"
        raise CheckpointError(msg)
    return arch


class _DenseNorm(Dense):
    """``<parent>.dense`` and ``<parent>.LayerNorm``: a projection added to the
    residual, then normalised (post-LN)."""

    def __init__(self, n_in: int, n_out: int, *, eps: float) -> None:
        super().__init__(n_in, n_out)
        self.LayerNorm = nn.LayerNorm(n_out, eps=eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.project(x) + residual)


class _Attention(nn.Module):
    def __init__(self, arch: BertArch) -> None:
        super().__init__()
        h = arch.hidden_size
        self.self = SelfAttention(h)
        self.output = _DenseNorm(h, h, eps=arch.layer_norm_eps)


class _Layer(nn.Module):
    def __init__(self, arch: BertArch) -> None:
        super().__init__()
        h = arch.hidden_size
        self.n_heads = arch.n_heads
        self.attention = _Attention(arch)
        self.intermediate = Dense(h, arch.intermediate_size)
        self.output = _DenseNorm(arch.intermediate_size, h, eps=arch.layer_norm_eps)

    def forward(self, x: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        attn = self.attention
        x = attn.output(attn.self.context(x, keys, self.n_heads), x)
        return self.output(self.intermediate.project(x, activation="gelu"), x)


class _Encoder(nn.Module):
    def __init__(self, arch: BertArch) -> None:
        super().__init__()
        self.layer = nn.ModuleList(_Layer(arch) for _ in range(arch.n_layers))


class BertNetwork(StackNetwork):
    """A BERT encoder behind the :class:`~embedcache.models.shared.encoder.EncoderNetwork` call.

    Layer ``0`` is the embedding output, ``i`` the output of block ``i``; ``n_layers``
    and ``-1`` the last block's (transformers' ``hidden_states`` numbering).
    """

    def __init__(self, arch: BertArch) -> None:
        super().__init__(arch, Embeddings(arch), _Encoder(arch))

    def embed(
        self, ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, Callable[[nn.Module, torch.Tensor], torch.Tensor]]:
        emb = self.embeddings
        positions = torch.arange(ids.shape[1], device=ids.device)
        # BertEmbeddings' order: (word + token type) + position
        x = emb.word_embeddings(ids) + emb.token_type_embeddings.weight[0]
        x = emb.LayerNorm(x + emb.position_embeddings(positions))
        keys = attention_mask[:, None, None, :].bool()
        return x, lambda block, x: block(x, keys)


def encoder_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The encoder's tensors of a ``BertModel`` or ``BertFor*`` state dict.

    A ``bert.`` prefix is removed; tensors outside ``embeddings.`` and ``encoder.``
    (heads, the pooler) are dropped, as transformers drops them when it builds
    ``BertModel`` without its pooler; any other tensor under those two is kept so a
    strict load refuses it.
    """
    out = {}
    for name, tensor in state.items():
        short = name.removeprefix("bert.")
        if short.startswith(_KEPT) and short not in _UNUSED_BUFFERS:
            out[short] = tensor
    return out


__all__ = [
    "BertArch",
    "BertNetwork",
    "arch_from_config",
    "encoder_state",
    "native_config",
]
