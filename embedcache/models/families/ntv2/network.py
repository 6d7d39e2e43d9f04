"""Nucleotide Transformer v2 in plain PyTorch: pre-LN ESM, rotary positions, gated FFN.

The arithmetic of the hub's ``modeling_esm.py`` (InstaDeepAI/nucleotide-transformer-v2-*,
revision 81b29e57), written out for inference only. Module and parameter names follow
the official ``EsmModel`` so a published state dict (``esm.`` prefix removed) loads
strictly. Per block::

    x = x + Wo(attention(rotary(Wq LN1(x)), rotary(Wk LN1(x)), Wv LN1(x)))
    a, b = split(W1 LN2(x))              # W1: hidden -> 2 x intermediate
    x = x + W2(silu(a) * b)              # biases of W1 and W2 as add_bias_fnn says

then one final LayerNorm (``emb_layer_norm_after``). Rotary embeddings rotate halves
(``rotate_half``) with base 10,000 over the head dimension, position = token index.
The query is scaled by 1/sqrt(head_dim) as the official code does (before the
rotation; the rotation is linear, so the order does not change the result).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from embedcache.errors import CheckpointError
from embedcache.models.shared.attention import attend
from embedcache.models.shared.bert_init import bert_init
from embedcache.models.shared.bert_modules import Dense, SelfAttention, StackNetwork
from embedcache.models.shared.config_fields import (
    BertSizes,
    bert_sizes,
    require_published,
    require_token_id,
)
from embedcache.models.shared.linear import project
from embedcache.models.shared.tuning import process_tuner

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

ROTARY_BASE = 10000.0


@dataclass(frozen=True, slots=True)
class NTv2Arch(BertSizes):
    """The architecture numbers of an NT-v2 ``config.json``."""

    add_bias_fnn: bool
    layer_norm_eps: float
    pad_token_id: int
    initializer_range: float

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.n_heads


def arch_from_config(config: Mapping[str, Any], *, where: str) -> NTv2Arch:
    """Read and check the fields NT-v2 needs; refuse variants the official code would
    run differently from what this module implements.

    Raises
    ------
    CheckpointError
        A field is missing or has the wrong type, or the config asks for an ESM
        feature NT-v2 does not use (absolute positions, token dropout, ...).
    """

    unsupported = {
        "position_embedding_type": ("rotary", config.get("position_embedding_type")),
        "emb_layer_norm_before": (False, bool(config.get("emb_layer_norm_before"))),
        "token_dropout": (False, bool(config.get("token_dropout"))),
        "is_folding_model": (False, bool(config.get("is_folding_model"))),
        "is_decoder": (False, bool(config.get("is_decoder"))),
    }
    require_published(unsupported, where=where, what="NT-v2")
    arch = NTv2Arch(
        **bert_sizes(config, where=where),
        # the official EsmConfig's default: biases unless the config says otherwise
        add_bias_fnn=bool(config.get("add_bias_fnn", True)),
        layer_norm_eps=float(config.get("layer_norm_eps", 1e-12)),
        pad_token_id=int(config.get("pad_token_id", 1)),
        initializer_range=float(config.get("initializer_range", 0.02)),
    )
    if arch.hidden_size % arch.n_heads or arch.head_dim % 2:
        msg = (
            f"{where}: hidden_size {arch.hidden_size} over {arch.n_heads} heads must give "
            "an even head dimension (rotary embeddings rotate halves)"
        )
        raise CheckpointError(msg)
    require_token_id("pad_token_id", arch.pad_token_id, arch.vocab_size, where=where)
    return arch


def inverse_frequencies(head_dim: int) -> torch.Tensor:
    """The rotary ``inv_freq`` the official code computes (and stores in checkpoints)."""
    return 1.0 / (
        ROTARY_BASE ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    )


def _rotate(
    x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor
) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` as the official code computes it, with the
    sign of ``rotate_half`` folded into ``signed_sin`` (= cat(-sin, sin) over the two
    halves): one product and one fused multiply-add instead of five element-wise
    passes, which cost as much as the projection itself in bf16 on CPU."""
    x1, x2 = x.chunk(2, dim=-1)
    return (x * cos).addcmul_(torch.cat((x2, x1), dim=-1), signed_sin)


class _Attention(nn.Module):
    def __init__(self, arch: NTv2Arch) -> None:
        super().__init__()
        self.self = SelfAttention(arch.hidden_size)
        self.output = Dense(arch.hidden_size, arch.hidden_size)
        self.LayerNorm = nn.LayerNorm(arch.hidden_size, eps=arch.layer_norm_eps)


class _Layer(nn.Module):
    def __init__(self, arch: NTv2Arch) -> None:
        super().__init__()
        h, i, bias = arch.hidden_size, arch.intermediate_size, arch.add_bias_fnn
        self.n_heads = arch.n_heads
        self.attention = _Attention(arch)
        self.intermediate = Dense(h, 2 * i, bias=bias)
        self.output = Dense(i, h, bias=bias)
        self.LayerNorm = nn.LayerNorm(h, eps=arch.layer_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        keys: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor:
        b, t, h = x.shape
        attn = self.attention
        y = attn.LayerNorm(x)
        tuner = process_tuner()

        def heads(linear: nn.Linear) -> torch.Tensor:  # (b, t, heads, head_dim)
            return project(linear, y, tuner=tuner).view(b, t, self.n_heads, -1)

        # rotated in the contiguous (b, t, heads, d) layout, then viewed as (b, heads, t, d)
        q = _rotate(heads(attn.self.query), cos, sin).transpose(1, 2)
        k = _rotate(heads(attn.self.key), cos, sin).transpose(1, 2)
        v = heads(attn.self.value).transpose(1, 2)
        # flash kernel or two matmuls: whichever this machine runs faster (tuning)
        context = attend(q, k, v, keys, tuner=tuner)
        x = x + attn.output.project(context.transpose(1, 2).reshape(b, t, h))
        gate, value = self.intermediate.project(self.LayerNorm(x)).chunk(2, dim=-1)
        # in place in the first half: no new (tokens x intermediate) tensor; the
        # output projection reads it with a row stride of 2 x intermediate, no copy
        return x + self.output.project(F.silu(gate, inplace=True).mul_(value))


class _Embeddings(nn.Module):
    def __init__(self, arch: NTv2Arch) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(
            arch.vocab_size, arch.hidden_size, padding_idx=arch.pad_token_id
        )


class _Encoder(nn.Module):
    def __init__(self, arch: NTv2Arch) -> None:
        super().__init__()
        self.layer = nn.ModuleList(_Layer(arch) for _ in range(arch.n_layers))
        self.emb_layer_norm_after = nn.LayerNorm(
            arch.hidden_size, eps=arch.layer_norm_eps
        )


class NTv2Network(StackNetwork):
    """The NT-v2 encoder behind the :class:`~embedcache.models.shared.encoder.EncoderNetwork` call.

    Layer ``0`` is the embedding output, ``i`` the output of block ``i`` for
    ``i < n_layers``; ``n_layers`` and ``-1`` are the final output after
    ``emb_layer_norm_after`` (the official ``hidden_states`` tuple's numbering).
    """

    def __init__(self, arch: NTv2Arch) -> None:
        super().__init__(arch, _Embeddings(arch), _Encoder(arch))

    @property
    def final_norm(self) -> nn.Module:
        return self.encoder.emb_layer_norm_after

    def _rotary(
        self, length: int, device: torch.device, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin (t, 1, head_dim), computed in float32, then cast."""
        inv = inverse_frequencies(self.arch.head_dim).to(device)
        angles = torch.outer(torch.arange(length, device=device, dtype=inv.dtype), inv)
        cos = torch.cat((angles.cos(), angles.cos()), dim=-1)
        sin = torch.cat((-angles.sin(), angles.sin()), dim=-1)
        return cos[:, None, :].to(dtype), sin[:, None, :].to(dtype)

    def embed(
        self, ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, Callable[[nn.Module, torch.Tensor], torch.Tensor]]:
        x = self.embeddings.word_embeddings(ids)
        # the official embedding zeroes padded positions (no effect on real ones)
        x = x * attention_mask.unsqueeze(-1).to(x.dtype)
        cos, sin = self._rotary(ids.shape[1], x.device, x.dtype)
        keys = attention_mask[:, None, None, :]
        return x, lambda block, x: block(x, keys, cos, sin)


def init_weights(network: NTv2Network, *, seed: int) -> None:
    """The official ``_init_weights`` (BERT's), drawn from a generator seeded with ``seed``:
    linear weights and embeddings ~ N(0, initializer_range), biases 0, the padding
    embedding 0, LayerNorm weight 1 and bias 0."""
    bert_init(network, std=network.arch.initializer_range, seed=seed)


__all__ = [
    "NTv2Arch",
    "NTv2Network",
    "arch_from_config",
    "init_weights",
    "inverse_frequencies",
]
