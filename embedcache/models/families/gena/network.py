"""GENA-LM's pre-LN BERT in plain PyTorch (AIRI-Institute/gena-lm-bert-*-t2t).

The arithmetic of ``src/gena_lm/modeling_bert.py`` (AIRI-Institute/GENA_LM) with
``pre_layer_norm: true``, dense attention and absolute positions, written out for
inference only. Module and parameter names follow the official ``BertModel`` so a
published state dict (``bert.`` prefix removed) loads strictly. Embeddings as in BERT
(word + position + token type 0, LayerNorm); per block::

    x = x + Wo(attention(pre_attention_ln(x)))
    x = x + W2(gelu(W1(post_attention_ln(x))))

and, when ``last_layer_norm`` (default: ``pre_layer_norm``) is set, a final
``last_layer_ln``. GELU is the exact (erf) one, ``hidden_act: gelu``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from embedcache.errors import CheckpointError
from embedcache.models.shared.bert_init import bert_init
from embedcache.models.shared.bert_modules import (
    Dense,
    Embeddings,
    SelfAttention,
    StackNetwork,
)
from embedcache.models.shared.config_fields import (
    BertSizes,
    bert_sizes,
    positive_int,
    require_published,
    require_token_id,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping


@dataclass(frozen=True, slots=True)
class GenaArch(BertSizes):
    """The architecture numbers of a GENA-LM BERT ``config.json``."""

    max_positions: int
    type_vocab_size: int
    last_layer_norm: bool
    layer_norm_eps: float
    pad_token_id: int
    initializer_range: float


def arch_from_config(config: Mapping[str, Any], *, where: str) -> GenaArch:
    """Read and check the fields GENA-LM's BERT needs; refuse the variants this module
    does not implement (sparse or rotary attention, post-LN, other activations).

    Raises
    ------
    CheckpointError
        A field is missing or has the wrong type, or the config asks for a variant.
    """

    def integer(name: str, default: int | None = None) -> int:
        return positive_int(config, name, where=where, default=default)

    pre_ln = bool(config.get("pre_layer_norm", False))
    checks = {
        "pre_layer_norm": (True, pre_ln),
        "position_embedding_type": (
            "absolute",
            config.get("position_embedding_type", "absolute"),
        ),
        "hidden_act": ("gelu", config.get("hidden_act", "gelu")),
        "sparse attention": (
            False,
            bool(config.get("sparse_config_cls") or config.get("sparse_attention")),
        ),
        "is_decoder": (False, bool(config.get("is_decoder"))),
    }
    require_published(checks, where=where, what="GENA-LM")
    arch = GenaArch(
        **bert_sizes(config, where=where),
        max_positions=integer("max_position_embeddings"),
        type_vocab_size=integer("type_vocab_size", 2),
        # the official default: a final LayerNorm whenever the blocks are pre-LN
        last_layer_norm=bool(config.get("last_layer_norm", pre_ln)),
        layer_norm_eps=float(config.get("layer_norm_eps", 1e-12)),
        pad_token_id=int(config.get("pad_token_id", 0)),
        initializer_range=float(config.get("initializer_range", 0.02)),
    )
    if arch.hidden_size % arch.n_heads:
        msg = f"{where}: hidden_size {arch.hidden_size} is not a multiple of {arch.n_heads} heads"
        raise CheckpointError(msg)
    require_token_id("pad_token_id", arch.pad_token_id, arch.vocab_size, where=where)
    return arch


class _Attention(nn.Module):
    def __init__(self, arch: GenaArch) -> None:
        super().__init__()
        self.self = SelfAttention(arch.hidden_size)
        self.output = Dense(arch.hidden_size, arch.hidden_size)


class _Layer(nn.Module):
    def __init__(self, arch: GenaArch) -> None:
        super().__init__()
        h, eps = arch.hidden_size, arch.layer_norm_eps
        self.n_heads = arch.n_heads
        self.pre_attention_ln = nn.LayerNorm(h, eps=eps)
        self.post_attention_ln = nn.LayerNorm(h, eps=eps)
        self.attention = _Attention(arch)
        self.intermediate = Dense(h, arch.intermediate_size)
        self.output = Dense(arch.intermediate_size, h)

    def forward(self, x: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        attn = self.attention
        context = attn.self.context(self.pre_attention_ln(x), keys, self.n_heads)
        x = x + attn.output.project(context)
        y = self.intermediate.project(self.post_attention_ln(x), activation="gelu")
        return x + self.output.project(y)


class _Encoder(nn.Module):
    def __init__(self, arch: GenaArch) -> None:
        super().__init__()
        self.layer = nn.ModuleList(_Layer(arch) for _ in range(arch.n_layers))
        if arch.last_layer_norm:
            self.last_layer_ln = nn.LayerNorm(arch.hidden_size, eps=arch.layer_norm_eps)


class GenaNetwork(StackNetwork):
    """The GENA-LM encoder behind the :class:`~embedcache.models.shared.encoder.EncoderNetwork` call.

    Layer ``0`` is the embedding output, ``i`` the output of block ``i`` for
    ``i < n_layers``; ``n_layers`` and ``-1`` are the final output (after
    ``last_layer_ln`` where the model has one), the official ``hidden_states``
    numbering.
    """

    def __init__(self, arch: GenaArch) -> None:
        super().__init__(
            arch, Embeddings(arch, padding_idx=arch.pad_token_id), _Encoder(arch)
        )

    @property
    def final_norm(self) -> nn.Module | None:
        return getattr(self.encoder, "last_layer_ln", None)

    def embed(
        self, ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, Callable[[nn.Module, torch.Tensor], torch.Tensor]]:
        emb = self.embeddings
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = (
            emb.word_embeddings(ids)
            + emb.token_type_embeddings.weight[0]
            + emb.position_embeddings(positions)
        )
        x = emb.LayerNorm(x)
        keys = attention_mask[:, None, None, :]
        return x, lambda block, x: block(x, keys)


def init_weights(network: GenaNetwork, *, seed: int) -> None:
    """The official ``_init_weights`` as it runs, drawn from a generator seeded with
    ``seed``: every linear weight and embedding ~ N(0, initializer_range), biases 0,
    the padding embedding 0, LayerNorm weight 1 and bias 0. (The official code's
    smaller std for output projections tests an attribute that only their parent
    modules carry, so it never applies.)"""
    bert_init(network, std=network.arch.initializer_range, seed=seed)


__all__ = ["GenaArch", "GenaNetwork", "arch_from_config", "init_weights"]
