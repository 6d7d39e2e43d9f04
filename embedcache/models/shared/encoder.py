"""The one adapter for token-based PyTorch families: tokenise, pad, forward, pool.

A family supplies three things and this module does the rest:

- a :class:`SequenceTokenizer`: an upper-case sequence -> token ids plus a flag per
  token saying whether it is special ([CLS], [SEP], BOS, ...);
- an :class:`EncoderNetwork`: a ``torch.nn.Module`` mapping right-padded ids and an
  attention mask to the hidden states of the layers asked for;
- :class:`EncoderTraits`: its name and version, whether it is causal, whether its first
  token is a classification token, its context length and key options.

Padding is always on the right and padded positions never enter a pooled vector
(causal models need no mask for this: no real position attends to a later padded
one). Each sequence is padded to the bucket of its own length
(:func:`~embedcache.models.shared.padding.padded_length`), never to its batch's
longest, so its vector does not depend on its batch, bit for bit. The
reverse-complement pass of ``rc_mode="average"`` runs in the same call as the
sequences themselves (each strand in its own length's bucket).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from embedcache.errors import (
    AdapterOptionError,
    InvalidSequenceError,
    SequenceTooLongError,
)
from embedcache.hashing import reverse_complement
from embedcache.models.base import DEFAULT_TOKEN_BUDGET
from embedcache.models.options import LAST_LAYER
from embedcache.models.shared.checkpoint import config_digest
from embedcache.models.shared.padding import padded_length
from embedcache.specs import ModelKey

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

    from embedcache.models.shared.checkpoint import Source

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Encoded:
    """One sequence's token ids and, per token, whether it is a special token."""

    ids: tuple[int, ...]
    special: tuple[bool, ...]

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.special):
            msg = f"{len(self.ids)} ids but {len(self.special)} special flags"
            raise ValueError(msg)

    def __len__(self) -> int:
        return len(self.ids)


class SequenceTokenizer(Protocol):
    """Turns an upper-case A/C/G/T/N sequence into the family's official token ids."""

    pad_id: int

    def encode(self, seq: str) -> Encoded: ...


class EncoderNetwork(Protocol):
    """A ``torch.nn.Module``: ids (b, t) + attention mask (b, t) -> hidden states.

    ``layers`` holds -1 (the final output, after any final norm: what the protocol
    pools), 0 (the embedding output) or ``i`` (the output of block ``i``); the result
    has one (b, t, d) tensor per requested layer, in order.
    """

    n_layers: int
    hidden_size: int

    def __call__(
        self, ids: torch.Tensor, attention_mask: torch.Tensor, layers: Sequence[int]
    ) -> list[torch.Tensor]: ...


@dataclass(frozen=True, slots=True)
class EncoderTraits:
    """What the engine and the key need to know about a family's checkpoint."""

    family: str  # recorded as the key's adapter, e.g. "ntv2"
    adapter_version: str
    causal: bool  # token i sees only tokens <= i
    has_cls: bool  # the first token is a classification token (pooling "cls")
    max_tokens: int | None  # longest input, special tokens included; None: no limit
    options: tuple[tuple[str, str], ...] = ()  # recorded in the key
    # padded tokens per forward pass that keep this family's matmuls busy
    token_budget: int = DEFAULT_TOKEN_BUDGET
    # attention score maps per sequence and layer (query heads); 0: no attention.
    # Bounds the batch of long sequences (see embedcache.engine.batching.BatchRule)
    attention_heads: int = 0

    @classmethod
    def bidirectional(
        cls,
        family: str,
        adapter_version: str,
        options: Sequence[tuple[str, str]],
        max_tokens: int | None,
        attention_heads: int,
        token_budget: int = DEFAULT_TOKEN_BUDGET,
    ) -> EncoderTraits:
        """A BERT-like encoder's: every token sees every other, the first is [CLS]."""
        return cls(
            family, adapter_version, causal=False, has_cls=True,
            max_tokens=max_tokens, options=tuple(options),
            token_budget=token_budget, attention_heads=attention_heads,
        )  # fmt: skip


def masked_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``hidden`` (b, t, d) over positions where ``mask`` (b, t) is true, in float32."""
    import torch

    weights = mask.to(torch.float32)
    summed = (hidden.float() * weights.unsqueeze(-1)).sum(dim=1)
    return summed / weights.sum(dim=1, keepdim=True)


def pool(hidden: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    """Pool (b, t, d) hidden states over the positions of ``mask`` (b, t): float32 (b, d).

    ``"mean"`` averages them, ``"cls"`` takes position 0, ``"last"`` the last position
    the mask marks (the last real token, whatever the padding).
    """
    import torch

    if how == "mean":
        return masked_mean(hidden, mask)
    if how == "cls":
        return hidden[:, 0].float()
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, -1).max(dim=1).values
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last].float()


def truncate_right(encoded: Encoded, max_tokens: int) -> Encoded:
    """Cut a sequence's own tokens on the right until it fits, keeping its special
    tokens at both ends (so [CLS] ... [SEP] stays well formed)."""
    if len(encoded) <= max_tokens:
        return encoded
    special = encoded.special
    head = next((i for i, s in enumerate(special) if not s), len(special))
    tail = next((i for i, s in enumerate(reversed(special)) if not s), 0)
    keep = max(max_tokens - head - tail, 0)
    ids = encoded.ids[: head + keep] + encoded.ids[len(encoded) - tail :]
    flags = special[: head + keep] + special[len(special) - tail :]
    return Encoded(ids[:max_tokens], flags[:max_tokens])


class EncoderAdapter:
    """Pooled hidden states of a token-based family; one key per requested layer.

    ``key`` is the first requested layer's key; ``embed_batch`` returns its vectors.
    ``keys`` and ``embed_layers`` give every requested layer at once (the engine
    stores each under its own key from one forward pass).
    """

    needs_equal_lengths = False
    # sequences padded to the bucket of their own length: batch by bucket
    pads_to_buckets = True

    def __init__(
        self,
        tokenizer: SequenceTokenizer,
        network: EncoderNetwork,
        traits: EncoderTraits,
        source: Source,
        *,
        default_rc_mode: str = "none",
    ) -> None:
        import torch

        options = source.options
        where = f"{source.where} ({traits.family})"
        if options.pooling == "cls" and not traits.has_cls:
            msg = f"{where}: pooling 'cls' needs a classification token, which this family has not; use mean"
            raise AdapterOptionError(msg)
        if options.pooling == "last" and not traits.causal:
            msg = f"{where}: pooling 'last' is for causal models, and this one is bidirectional; use mean or cls"
            raise AdapterOptionError(msg)
        bad = [x for x in options.layers if x > network.n_layers]
        if bad:
            msg = (
                f"{where}: layer {bad[0]} does not exist; use -1 (last) or "
                f"0..{network.n_layers} (0 = embeddings)"
            )
            raise AdapterOptionError(msg)
        if options.kmer_split is not None and traits.family != "hf-encoder":
            msg = f"{where}: --kmer-split applies to generic encoders only; this family tokenises itself"
            raise AdapterOptionError(msg)
        self.tokenizer = tokenizer
        self.network = network
        self.traits = traits
        self.options = options
        self.device = torch.device(source.device)
        self.rc_mode = options.rc_mode or default_rc_mode
        self.layers = options.layers
        self.dim = int(network.hidden_size)
        self.max_tokens = traits.max_tokens
        self.preferred_token_budget = traits.token_budget
        # what the token budget's speed depends on (engine.budget): not the weights
        self.tuning_shape = (
            f"{traits.family} hidden={self.dim} layers={network.n_layers} "
            f"rc={self.rc_mode} {self.device.type}"
        )
        # both strands of a sequence run in one batch under RC averaging
        strands = 2 if self.rc_mode == "average" else 1
        self.attention_maps = traits.attention_heads * strands
        self.alias = source.alias
        self.keys = tuple(
            ModelKey(
                model_id=source.model_id,
                revision=source.revision,
                adapter=traits.family,
                adapter_version=traits.adapter_version,
                layer=layer,
                pooling=options.pooling,
                special_tokens=options.special_tokens,
                rc_mode=self.rc_mode,
                dtype=options.dtype,
                max_length=traits.max_tokens,
                truncation=options.truncation,
                options=traits.options,
            )
            for layer in self.layers
        )
        self.key = self.keys[0]
        logger.info(
            "loaded %s (dim %d, %d layers, max %s tokens)",
            self.key.short(),
            self.dim,
            network.n_layers,
            self.max_tokens,
        )

    def __repr__(self) -> str:
        return f"EncoderAdapter({self.key.short()}, dim={self.dim})"

    # --- token counts (length checks and batching) ---------------------------------

    def _encode(self, seq: str) -> Encoded:
        encoded = self.tokenizer.encode(seq)
        if (
            self.options.truncation == "right"
            and self.max_tokens is not None
            and len(encoded) > self.max_tokens
        ):
            return truncate_right(encoded, self.max_tokens)
        return encoded

    def _encode_many(self, seqs: Sequence[str]) -> list[Encoded]:
        many = getattr(self.tokenizer, "encode_many", None)
        encoded = list(many(seqs)) if many else [self.tokenizer.encode(s) for s in seqs]
        if self.options.truncation == "right" and self.max_tokens is not None:
            limit = self.max_tokens
            encoded = [
                truncate_right(e, limit) if len(e) > limit else e for e in encoded
            ]
        return encoded

    def n_tokens(self, seq: str) -> int:
        """Tokens of ``seq`` as the model sees them (special tokens included)."""
        return self.n_tokens_many([seq])[0]

    def n_tokens_many(self, seqs: Sequence[str]) -> list[int]:
        """:meth:`n_tokens` of many sequences; the longer strand in RC mode ``average``.

        Untruncated counts: the engine compares them with the context to refuse a
        sequence that is too long unless truncation was asked for.
        """
        many = getattr(self.tokenizer, "encode_many", None)
        encode = many or (lambda ss: [self.tokenizer.encode(s) for s in ss])
        counts = [len(e) for e in encode(seqs)]
        if self.rc_mode == "average":
            rc = encode([reverse_complement(s) for s in seqs])
            counts = [max(a, len(b)) for a, b in zip(counts, rc, strict=True)]
        return counts

    # --- embedding ------------------------------------------------------------------

    def embed_batch(self, seqs: Sequence[str]) -> np.ndarray:
        """Float32 (len(seqs), dim): the vectors of :attr:`key`."""
        return self.embed_layers(seqs)[0]

    def embed_layers(self, seqs: Sequence[str]) -> np.ndarray:
        """Float32 (len(keys), len(seqs), dim): every requested layer, one forward pass."""
        import torch

        if not seqs:
            return np.zeros((len(self.keys), 0, self.dim), dtype=np.float32)
        with torch.inference_mode():
            if self.rc_mode == "average":
                both = list(seqs) + [reverse_complement(s) for s in seqs]
                pooled = self._pool(both)
                n = len(seqs)
                pooled = (pooled[:, :n] + pooled[:, n:]) / 2
            else:
                pooled = self._pool(seqs)
        return pooled.cpu().numpy().astype(np.float32, copy=False)

    def _pool(self, seqs: Sequence[str]) -> torch.Tensor:
        """(len(keys), len(seqs), dim) pooled vectors, each sequence padded to the
        bucket of its own length (:func:`padded_length`), one forward pass a bucket."""
        import torch

        encoded = self._encode_many(seqs)
        longest = max(len(e) for e in encoded)
        if self.max_tokens is not None and longest > self.max_tokens:
            row = max(range(len(seqs)), key=lambda i: len(encoded[i]))
            msg = (
                f"a sequence of {len(seqs[row])} bp is {len(encoded[row])} tokens, more "
                f"than the {self.max_tokens} {self.key.model_id} accepts; truncate "
                "explicitly (--truncate right) to cut it"
            )
            raise SequenceTooLongError(msg)
        exclude = self.options.special_tokens == "exclude"
        for row, e in enumerate(encoded):
            if not len(e) or (exclude and all(e.special)):
                msg = (
                    f"sequence {row} of the batch (length {len(seqs[row])}) has no "
                    "tokens left to pool once special tokens are excluded"
                )
                raise InvalidSequenceError(msg)
        buckets: dict[int, list[int]] = {}
        for row, e in enumerate(encoded):
            length = padded_length(len(e), limit=self.max_tokens)
            buckets.setdefault(length, []).append(row)
        if len(buckets) == 1:
            [(length, _)] = buckets.items()
            return self._pool_padded(encoded, length)
        out = torch.empty((len(self.layers), len(seqs), self.dim), dtype=torch.float32)
        for length, rows in buckets.items():
            out[:, rows] = self._pool_padded([encoded[i] for i in rows], length)
        return out

    def _pool_padded(self, encoded: list[Encoded], length: int) -> torch.Tensor:
        """One forward pass of ``encoded`` padded on the right to ``length`` tokens."""
        import torch

        ids = torch.full(
            (len(encoded), length), self.tokenizer.pad_id, dtype=torch.long
        )
        attention = torch.zeros((len(encoded), length), dtype=torch.bool)
        special = torch.zeros((len(encoded), length), dtype=torch.bool)
        for row, e in enumerate(encoded):
            ids[row, : len(e)] = torch.tensor(e.ids, dtype=torch.long)
            attention[row, : len(e)] = True
            special[row, : len(e)] = torch.tensor(e.special, dtype=torch.bool)
        mask = (
            attention & ~special
            if self.options.special_tokens == "exclude"
            else attention
        )
        hidden = self.network(
            ids.to(self.device), attention.to(self.device), list(self.layers)
        )
        mask = mask.to(self.device)
        return torch.stack([pool(h, mask, self.options.pooling) for h in hidden])


__all__ = [
    "DEFAULT_TOKEN_BUDGET",
    "LAST_LAYER",
    "Encoded",
    "EncoderAdapter",
    "EncoderNetwork",
    "EncoderTraits",
    "SequenceTokenizer",
    "config_digest",
    "masked_mean",
    "pool",
    "truncate_right",
]
