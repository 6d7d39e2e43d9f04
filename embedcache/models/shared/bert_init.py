"""BERT's ``_init_weights``, seeded: the random-init control of BERT-style families."""

from __future__ import annotations

import torch
from torch import nn


def bert_init(network: nn.Module, *, std: float, seed: int) -> None:
    """Every linear weight and embedding ~ N(0, ``std``) from a generator seeded with
    ``seed`` (in module order), biases 0, padding embeddings 0, LayerNorm 1 and 0."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in network.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                module.weight.normal_(0.0, std, generator=generator)
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.zero_()
            if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                module.weight[module.padding_idx].zero_()
            if isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
                module.bias.zero_()
