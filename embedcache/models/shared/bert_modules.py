"""Pieces the BERT-style encoders share: module names a checkpoint expects, the
network shell (embeddings, then a block stack), and running the block stack while
keeping the hidden states a caller asked for.

Layer numbering is the official ``hidden_states`` one: 0 the embedding output, ``i``
block ``i``'s output, ``n_layers`` and -1 the final output (after any final norm).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from embedcache.models.shared.attention import attend
from embedcache.models.shared.linear import project
from embedcache.models.shared.tuning import process_tuner

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import torch


class SelfAttention(nn.Module):
    """The ``query``, ``key`` and ``value`` projections (``attention.self.*``)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.query = nn.Linear(hidden_size, hidden_size)
        self.key = nn.Linear(hidden_size, hidden_size)
        self.value = nn.Linear(hidden_size, hidden_size)

    def context(
        self, x: torch.Tensor, keys: torch.Tensor, n_heads: int
    ) -> torch.Tensor:
        """Multi-head attention of ``x`` (b, t, h) over the positions ``keys`` lets
        it see (SDPA's boolean mask): the context, (b, t, h), before the output
        projection."""
        b, t, h = x.shape
        tuner = process_tuner()

        def heads(linear: nn.Linear) -> torch.Tensor:
            y = project(linear, x, tuner=tuner)
            return y.view(b, t, n_heads, -1).transpose(1, 2)

        # flash kernel or two matmuls: whichever this machine runs faster (tuning)
        context = attend(
            heads(self.query), heads(self.key), heads(self.value), keys, tuner=tuner
        )
        return context.transpose(1, 2).reshape(b, t, h)


class Embeddings(nn.Module):
    """BERT's embedding tables and their norm (``embeddings.*``), sized from an arch
    with ``vocab_size``, ``hidden_size``, ``max_positions``, ``type_vocab_size`` and
    ``layer_norm_eps``."""

    def __init__(self, arch: Any, *, padding_idx: int | None = None) -> None:  # noqa: ANN401
        super().__init__()
        h = arch.hidden_size
        self.word_embeddings = nn.Embedding(arch.vocab_size, h, padding_idx=padding_idx)
        self.position_embeddings = nn.Embedding(arch.max_positions, h)
        self.token_type_embeddings = nn.Embedding(arch.type_vocab_size, h)
        self.LayerNorm = nn.LayerNorm(h, eps=arch.layer_norm_eps)


class Dense(nn.Module):
    """One linear layer stored as ``<parent>.dense``."""

    def __init__(self, n_in: int, n_out: int, *, bias: bool = True) -> None:
        super().__init__()
        self.dense = nn.Linear(n_in, n_out, bias=bias)

    def project(self, x: torch.Tensor, *, activation: str = "none") -> torch.Tensor:
        """``activation(dense(x))`` by this machine's choice of linear kernel."""
        return project(self.dense, x, tuner=process_tuner(), activation=activation)


class StackNetwork(nn.Module):
    """An encoder as ``embeddings`` then the blocks ``encoder.layer``, behind the
    :class:`~embedcache.models.shared.encoder.EncoderNetwork` call.

    A family subclasses it with ``embed(ids, attention_mask)``, which returns the
    embedding output and the ``step(block, x)`` running one block, and sets
    ``final_norm`` where the stack ends in a norm.
    """

    final_norm: nn.Module | None = None

    def __init__(self, arch: Any, embeddings: nn.Module, encoder: nn.Module) -> None:  # noqa: ANN401
        super().__init__()
        self.arch = arch
        self.n_layers = arch.n_layers
        self.hidden_size = arch.hidden_size
        self.embeddings = embeddings
        self.encoder = encoder

    def embed(
        self, ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, Callable[[nn.Module, torch.Tensor], torch.Tensor]]:
        raise NotImplementedError

    def forward(
        self,
        ids: torch.Tensor,
        attention_mask: torch.Tensor,
        layers: Sequence[int],
    ) -> list[torch.Tensor]:
        x, step = self.embed(ids, attention_mask)
        return run_stack(
            x, self.encoder.layer, layers, step=step, final=self.final_norm
        )


def run_stack(
    x: torch.Tensor,
    blocks: nn.ModuleList,
    layers: Sequence[int],
    *,
    step: Callable[[nn.Module, torch.Tensor], torch.Tensor],
    final: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """Run ``x`` (the embedding output) through ``blocks`` with ``step(block, x)`` as
    far as the deepest layer asked for; return one tensor per entry of ``layers``.

    The last block's output goes through ``final`` (a final norm), if any.
    """
    last = len(blocks)
    wanted = {last if layer == -1 else layer for layer in layers}
    states: dict[int, torch.Tensor] = {0: x} if 0 in wanted else {}
    for i, block in enumerate(blocks[: max(wanted)], start=1):
        x = step(block, x)
        if i in wanted and i < last:
            states[i] = x
    if last in wanted:
        states[last] = final(x) if final is not None else x
    return [states[last if layer == -1 else layer] for layer in layers]


__all__ = ["Dense", "SelfAttention", "StackNetwork", "run_stack"]
