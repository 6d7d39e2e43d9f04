"""MosaicBERT, the network of DNABERT-2 and DNABERT-S, in plain PyTorch.

What it computes (the hub's ``bert_layers.py``, PyTorch attention path):

- embeddings: word + token-type-0 embeddings, LayerNorm; no position embeddings;
- per block, post-LN: a fused ``Wqkv`` projection, attention with an ALiBi bias
  (``-slope_h * |i - j|``), ``dense`` + residual + LayerNorm; then a gated feed-forward
  (``gated_layers`` without bias to 2 x intermediate, exact GELU of the first half times
  the second half, ``wo`` with bias) + residual + LayerNorm;
- no final norm: the last block's output is the model's output.

Padding is masked exactly (padded keys get ``-inf``), so a sequence's states do not
depend on its batch; the official code adds -10000 instead and drops padded tokens
between blocks ("unpadding"), an optimisation that changes nothing else.

Parameter names are the checkpoint's without the ``bert.`` prefix, so a published
state dict loads strictly as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from embedcache.errors import CheckpointError
from embedcache.models.shared.attention import attend
from embedcache.models.shared.bert_modules import StackNetwork
from embedcache.models.shared.linear import project
from embedcache.models.shared.tuning import process_tuner

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping


@dataclass(frozen=True, slots=True)
class MosaicBertArch:
    """The sizes a MosaicBERT ``config.json`` fixes."""

    vocab_size: int
    hidden_size: int
    n_heads: int
    n_layers: int
    intermediate_size: int
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int | None = None

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.n_heads


def arch_from_config(config: Mapping[str, Any], *, where: str) -> MosaicBertArch:
    """Read and check the architecture fields of a DNABERT-2/DNABERT-S ``config.json``.

    ``pad_token_id`` only decides which embedding row the random initialisation zeroes:
    the config class of the 2023 hub files (transformers' ``BertConfig``, recognisable
    by ``model_type: bert``) defaults it to 0, the 2024 one (``PretrainedConfig``) to
    None.

    Raises
    ------
    CheckpointError
        A field is missing, not a positive integer, or the sizes do not fit together.
    """
    sizes = {}
    for name in (
        "vocab_size",
        "hidden_size",
        "num_attention_heads",
        "num_hidden_layers",
        "intermediate_size",
    ):
        value = config.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            msg = f"{where}: {name} is {value!r}; a MosaicBERT config needs a positive integer"
            raise CheckpointError(msg)
        sizes[name] = value
    if sizes["hidden_size"] % sizes["num_attention_heads"]:
        msg = (
            f"{where}: hidden_size {sizes['hidden_size']} is not a multiple of "
            f"num_attention_heads {sizes['num_attention_heads']}"
        )
        raise CheckpointError(msg)
    default_pad = 0 if config.get("model_type") == "bert" else None
    pad = config.get("pad_token_id", default_pad)
    return MosaicBertArch(
        vocab_size=sizes["vocab_size"],
        hidden_size=sizes["hidden_size"],
        n_heads=sizes["num_attention_heads"],
        n_layers=sizes["num_hidden_layers"],
        intermediate_size=sizes["intermediate_size"],
        type_vocab_size=int(config.get("type_vocab_size", 2)),
        layer_norm_eps=float(config.get("layer_norm_eps", 1e-12)),
        initializer_range=float(config.get("initializer_range", 0.02)),
        pad_token_id=None if pad is None else int(pad),
    )


def alibi_slopes(n_heads: int) -> list[float]:
    """ALiBi's per-head slopes (Press et al.): a geometric series from ``2**(-8/n)``.

    For a head count that is not a power of two, the slopes of the largest power of
    two below it come first, then every other slope of the next power of two (so 12
    heads get the 8-head series followed by 4 of the 16-head one).
    """

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n_heads).is_integer():
        return power_of_two(n_heads)
    lower = 2 ** math.floor(math.log2(n_heads))
    return power_of_two(lower) + alibi_slopes(2 * lower)[0::2][: n_heads - lower]


class MosaicBertEmbeddings(nn.Module):
    """Word + token-type-0 embeddings and LayerNorm (no position embeddings)."""

    def __init__(self, arch: MosaicBertArch) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.token_type_embeddings = nn.Embedding(
            arch.type_vocab_size, arch.hidden_size
        )
        self.LayerNorm = nn.LayerNorm(arch.hidden_size, eps=arch.layer_norm_eps)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # every token is of type 0, as the official model's default token_type_ids
        x = self.word_embeddings(ids) + self.token_type_embeddings.weight[0]
        return self.LayerNorm(x)


class MosaicBertBlock(nn.Module):
    """One post-LN block: ALiBi self-attention, then the gated feed-forward."""

    def __init__(self, arch: MosaicBertArch) -> None:
        super().__init__()
        d, eps = arch.hidden_size, arch.layer_norm_eps
        self.n_heads = arch.n_heads
        self.intermediate_size = arch.intermediate_size
        self.attention = nn.ModuleDict(
            {
                "self": nn.ModuleDict({"Wqkv": nn.Linear(d, 3 * d)}),
                "output": nn.ModuleDict(
                    {"dense": nn.Linear(d, d), "LayerNorm": nn.LayerNorm(d, eps=eps)}
                ),
            }
        )
        self.mlp = nn.ModuleDict(
            {
                "gated_layers": nn.Linear(d, 2 * arch.intermediate_size, bias=False),
                "wo": nn.Linear(arch.intermediate_size, d),
                "layernorm": nn.LayerNorm(d, eps=eps),
            }
        )

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.n_heads
        tuner = process_tuner()
        # Wqkv's output is [q | k | v], each laid out head by head
        qkv = project(self.attention["self"]["Wqkv"], x, tuner=tuner)
        q, k, v = qkv.view(b, t, 3, h, d // h).permute(2, 0, 3, 1, 4).unbind(0)
        # flash kernel or two matmuls: whichever this machine runs faster (tuning)
        context = attend(q, k, v, bias, tuner=tuner)  # each (b, h, t, d/h)
        context = context.transpose(1, 2).reshape(b, t, d)
        out = self.attention["output"]
        x = out["LayerNorm"](project(out["dense"], context, tuner=tuner) + x)
        mlp = self.mlp
        gated, plain = project(mlp["gated_layers"], x, tuner=tuner).split(
            self.intermediate_size, dim=-1
        )
        y = project(mlp["wo"], F.gelu(gated) * plain, tuner=tuner)
        return mlp["layernorm"](y + x)


class MosaicBertEncoder(nn.Module):
    """The stack of blocks (``encoder.layer.<i>``)."""

    def __init__(self, arch: MosaicBertArch) -> None:
        super().__init__()
        self.layer = nn.ModuleList(MosaicBertBlock(arch) for _ in range(arch.n_layers))


class MosaicBertNetwork(StackNetwork):
    """A DNABERT-2/DNABERT-S encoder behind the ``EncoderNetwork`` call.

    ``forward(ids, attention_mask, layers)`` returns one (b, t, d) tensor per requested
    layer: -1 and ``n_layers`` the last block's output, 0 the embedding output, ``i``
    block ``i``'s output. Padded positions hold finite values that mean nothing.
    """

    def __init__(self, arch: MosaicBertArch) -> None:
        super().__init__(arch, MosaicBertEmbeddings(arch), MosaicBertEncoder(arch))
        # kept out of the module's tensors so a bf16 cast leaves them float32
        self.slopes = tuple(alibi_slopes(arch.n_heads))

    def attention_bias(
        self, attention_mask: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        """ALiBi plus the padding mask: (b or 1, heads, t, t) in ``dtype``."""
        t = attention_mask.shape[1]
        pos = torch.arange(t, device=attention_mask.device)
        distance = (pos[None, :] - pos[:, None]).abs()
        slopes = torch.tensor(self.slopes, dtype=torch.float32, device=pos.device)
        # float32 first, as the official table (slope * -distance), then cast
        alibi = (slopes[:, None, None] * -distance).unsqueeze(0)
        if not bool(attention_mask.all()):
            keys = ~attention_mask[:, None, None, :]
            alibi = alibi.masked_fill(keys, float("-inf"))
        return alibi.to(dtype)

    def embed(
        self, ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, Callable[[nn.Module, torch.Tensor], torch.Tensor]]:
        x = self.embeddings(ids)
        bias = self.attention_bias(attention_mask.bool(), x.dtype)
        return x, lambda block, x: block(x, bias)

    def reset_parameters(self, *, seed: int) -> None:
        """The official ``_init_weights`` (transformers' BERT), seeded: linear and
        embedding weights ~ N(0, initializer_range), biases 0, LayerNorm 1 and 0, the
        padding row (if the config has one) 0."""
        generator = torch.Generator().manual_seed(seed)
        std = self.arch.initializer_range
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear | nn.Embedding):
                    noise = torch.randn(module.weight.shape, generator=generator) * std
                    module.weight.copy_(noise)
                    bias = getattr(module, "bias", None)
                    if bias is not None:
                        bias.zero_()
                elif isinstance(module, nn.LayerNorm):
                    module.weight.fill_(1.0)
                    module.bias.zero_()
            pad = self.arch.pad_token_id
            if pad is not None and 0 <= pad < self.arch.vocab_size:
                self.embeddings.word_embeddings.weight[pad].zero_()


__all__ = [
    "MosaicBertArch",
    "MosaicBertNetwork",
    "alibi_slopes",
    "arch_from_config",
]
