"""A transformers model (``hf`` encoders, ``generator`` Llama decoders) behind the
:class:`~embedcache.models.shared.encoder.EncoderNetwork` call.

Layer numbering is transformers' ``hidden_states`` one: -1 the last hidden state
(after any final norm), 0 the embedding output, ``i < n_layers`` block ``i``'s output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch


class HFNetwork(nn.Module):
    """``model`` called with ``output_hidden_states`` only when a layer other than -1
    is asked for.

    ``causal`` (right padding and causal attention): no real position attends to a
    later padded one, so no mask is passed and the causal fast path runs, without a
    key/value cache. Otherwise the attention mask is passed as transformers expects.
    """

    def __init__(
        self,
        model: nn.Module,
        config: Any,  # noqa: ANN401
        *,
        causal: bool,
    ) -> None:
        super().__init__()
        self.model = model
        self.causal = causal
        self.n_layers = int(config.num_hidden_layers)
        self.hidden_size = int(config.hidden_size)

    def forward(
        self,
        ids: torch.Tensor,
        attention_mask: torch.Tensor,
        layers: Sequence[int],
    ) -> list[torch.Tensor]:
        need_all = any(layer != -1 for layer in layers)
        if self.causal:
            extra: dict[str, Any] = {"use_cache": False}
        else:
            extra = {"attention_mask": attention_mask.long()}
        out = self.model(input_ids=ids, output_hidden_states=need_all, **extra)
        # transformers reports hidden_states[n_layers] after the final norm, as
        # last_hidden_state; hidden_states[i < n_layers] is block i's output
        return [
            out.last_hidden_state if layer == -1 else out.hidden_states[layer]
            for layer in layers
        ]


__all__ = ["HFNetwork"]
