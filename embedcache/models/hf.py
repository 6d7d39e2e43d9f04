"""Generic Hugging Face encoders (BERT, ESM / Nucleotide Transformer, DNABERT, GROVER, ...).

Loaded through ``AutoTokenizer`` / ``AutoModel`` from a local directory in HF layout.
The pooled vector is the mean of one layer's hidden states over the sequence's tokens:
padding is always left out, special tokens ([CLS], [SEP], ...) by default too.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from embedcache.errors import (
    AdapterOptionError,
    InvalidSequenceError,
    SequenceTooLongError,
    UnknownModelError,
)
from embedcache.hashing import reverse_complement
from embedcache.specs import ModelKey

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    import torch

logger = logging.getLogger(__name__)

HF_ADAPTER_VERSION = "1"
DTYPES = ("float32", "bfloat16")
SPECIAL_TOKEN_POLICIES = ("exclude", "include")
TRUNCATION_POLICIES = ("error", "right")
RC_MODES = ("none", "average")
# tokenizers report this (or larger) when they know no limit
_NO_LIMIT = 10**8
# models whose learned positions start after the padding index (RoBERTa heritage)
_OFFSET_POSITIONS = frozenset({"esm", "roberta", "xlm-roberta", "camembert"})


def kmer_split(seq: str, k: int) -> str:
    """DNABERT-style input: overlapping k-mers joined by spaces (``ACGTA``, 3 -> ``ACG CGT GTA``)."""
    if len(seq) < k:
        return seq
    return " ".join(seq[i : i + k] for i in range(len(seq) - k + 1))


def masked_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``hidden`` (b, t, d) over positions where ``mask`` (b, t) is true, in float32."""
    import torch

    weights = mask.to(torch.float32)
    summed = (hidden.float() * weights.unsqueeze(-1)).sum(dim=1)
    return summed / weights.sum(dim=1, keepdim=True)


def _max_tokens(config: object, tokenizer: object) -> int | None:
    """The longest input (special tokens included) the model accepts, or None if unlimited."""
    limits = []
    tok_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_max, int) and 0 < tok_max < _NO_LIMIT:
        limits.append(tok_max)
    position_type = getattr(config, "position_embedding_type", "absolute")
    n_positions = getattr(config, "max_position_embeddings", None)
    if isinstance(n_positions, int) and position_type == "absolute":
        if getattr(config, "model_type", "") in _OFFSET_POSITIONS:
            pad = getattr(config, "pad_token_id", None) or 0
            n_positions -= pad + 1
        limits.append(n_positions)
    return min(limits) if limits else None


class HFEncoderAdapter:
    """Masked mean-pooled hidden states of a Hugging Face encoder.

    Parameters
    ----------
    path
        Local directory in HF layout (config, tokenizer, weights).
    model_id, revision
        Recorded in the key: the name the user gave and the resolved commit or digest.
    layer
        -1 (default) pools ``last_hidden_state`` (after any final layer norm); another
        value indexes ``hidden_states`` (0 = embedding output, ``n_layers`` = last layer
        before a final norm).
    special_tokens
        ``"exclude"`` pools the sequence's own tokens only; ``"include"`` adds [CLS]/[SEP]...
    truncation
        ``"error"``: a too-long sequence raises; ``"right"``: it is cut to the model's maximum.
    kmer_split
        Pre-split each sequence into overlapping k-mers joined by spaces (DNABERT).
    rc_mode
        ``"average"``: mean of the pooled vectors of the sequence and its reverse complement.
    dtype
        Compute dtype; the model is cast (measured faster than autocast on these CPUs).
    """

    needs_equal_lengths = False

    def __init__(
        self,
        path: Path,
        *,
        model_id: str,
        revision: str,
        dtype: str = "float32",
        device: str = "cpu",
        layer: int = -1,
        special_tokens: str = "exclude",
        truncation: str = "error",
        kmer_split: int | None = None,
        rc_mode: str = "none",
        trust_remote_code: bool = False,
    ) -> None:
        import torch
        from transformers import AutoConfig, AutoModel, AutoTokenizer

        _check_choice("dtype", dtype, DTYPES, model_id)
        _check_choice(
            "special-token policy", special_tokens, SPECIAL_TOKEN_POLICIES, model_id
        )
        _check_choice("truncation policy", truncation, TRUNCATION_POLICIES, model_id)
        _check_choice("rc mode", rc_mode, RC_MODES, model_id)
        if kmer_split is not None and not 1 <= kmer_split <= 12:
            msg = f"{model_id}: kmer split {kmer_split} is outside 1..12"
            raise AdapterOptionError(msg)
        try:
            config = AutoConfig.from_pretrained(
                path, trust_remote_code=trust_remote_code
            )
            self.tokenizer = AutoTokenizer.from_pretrained(
                path, trust_remote_code=trust_remote_code
            )
            model = _load_model(
                AutoModel, path, config, trust_remote_code=trust_remote_code
            )
        except (OSError, ValueError, KeyError) as err:
            msg = (
                f"cannot load {model_id!r} from {path} as a Hugging Face encoder: {err}. "
                "Check the directory holds config.json, tokenizer files and weights; "
                "models with custom code need --trust-remote-code."
            )
            raise UnknownModelError(msg) from err
        n_layers = getattr(config, "num_hidden_layers", None)
        if layer != -1 and (n_layers is None or not 0 <= layer <= n_layers):
            msg = (
                f"{model_id}: layer {layer} does not exist; use -1 (last) or "
                f"0..{n_layers} (0 = embeddings)"
            )
            raise AdapterOptionError(msg)
        self.torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        self.device = torch.device(device)
        self.model = model.to(device=self.device, dtype=self.torch_dtype).eval()
        self.layer = layer
        self.special_tokens = special_tokens
        self.truncation = truncation
        self.kmer = kmer_split
        self.rc_mode = rc_mode
        self.dim = int(config.hidden_size)
        self.max_tokens = _max_tokens(config, self.tokenizer)
        options = [("model_type", str(getattr(config, "model_type", "")))]
        if kmer_split is not None:
            options.append(("kmer_split", str(kmer_split)))
        self.key = ModelKey(
            model_id=model_id,
            revision=revision,
            adapter="hf-encoder",
            adapter_version=HF_ADAPTER_VERSION,
            layer=layer,
            pooling="mean",
            special_tokens=special_tokens,
            rc_mode=rc_mode,
            dtype=dtype,
            max_length=self.max_tokens,
            truncation=truncation,
            options=tuple(options),
        )
        logger.info(
            "loaded %s (dim %d, max %s tokens)",
            self.key.short(),
            self.dim,
            self.max_tokens,
        )

    def _text(self, seq: str) -> str:
        return kmer_split(seq, self.kmer) if self.kmer else seq

    def n_tokens(self, seq: str) -> int:
        n = len(self.tokenizer(self._text(seq), add_special_tokens=True)["input_ids"])
        if self.rc_mode == "average":
            rc = self._text(reverse_complement(seq))
            n = max(n, len(self.tokenizer(rc, add_special_tokens=True)["input_ids"]))
        return n

    def n_tokens_many(self, seqs: Sequence[str]) -> list[int]:
        """``n_tokens`` for many sequences at once (one call into the fast tokenizer)."""
        if not seqs:
            return []
        enc = self.tokenizer([self._text(s) for s in seqs], add_special_tokens=True)
        counts = [len(ids) for ids in enc["input_ids"]]
        if self.rc_mode == "average":
            rcs = [self._text(reverse_complement(s)) for s in seqs]
            enc_rc = self.tokenizer(rcs, add_special_tokens=True)
            counts = [
                max(a, len(b)) for a, b in zip(counts, enc_rc["input_ids"], strict=True)
            ]
        return counts

    def embed_batch(self, seqs: Sequence[str]) -> np.ndarray:
        import torch

        with torch.inference_mode():
            pooled = self._pool(seqs)
            if self.rc_mode == "average":
                pooled = (
                    pooled + self._pool([reverse_complement(s) for s in seqs])
                ) / 2
        return pooled.cpu().numpy().astype(np.float32, copy=False)

    def _pool(self, seqs: Sequence[str]) -> torch.Tensor:
        truncate = self.truncation == "right" and self.max_tokens is not None
        enc = self.tokenizer(
            [self._text(s) for s in seqs],
            padding=True,
            truncation=truncate,
            max_length=self.max_tokens if truncate else None,
            return_special_tokens_mask=True,
            return_tensors="pt",
        )
        if self.max_tokens is not None and enc["input_ids"].shape[1] > self.max_tokens:
            lengths = enc["attention_mask"].sum(dim=1).tolist()
            row = max(range(len(seqs)), key=lambda i: lengths[i])
            msg = (
                f"a sequence of {len(seqs[row])} bp is {lengths[row]} tokens, more than the "
                f"{self.max_tokens} {self.key.model_id} accepts; pass truncation='right' to cut it"
            )
            raise SequenceTooLongError(msg)
        special = enc.pop("special_tokens_mask").bool()
        attention = enc["attention_mask"].bool()
        inputs = {k: v.to(self.device) for k, v in enc.items()}
        out = self.model(**inputs, output_hidden_states=self.layer != -1)
        hidden = (
            out.last_hidden_state if self.layer == -1 else out.hidden_states[self.layer]
        )
        mask = attention & ~special if self.special_tokens == "exclude" else attention
        empty = ~mask.any(dim=1)
        if bool(empty.any()):
            row = int(empty.nonzero()[0, 0])
            msg = f"sequence {seqs[row]!r} has no tokens left to pool once special tokens are excluded"
            raise InvalidSequenceError(msg)
        return masked_mean(hidden, mask.to(self.device))


def _load_model(
    auto: type, path: Path, config: object, *, trust_remote_code: bool
) -> object:
    import torch

    kwargs = {
        "config": config,
        "trust_remote_code": trust_remote_code,
        "dtype": torch.float32,
    }
    try:
        # BERT/ESM-style encoders carry a [CLS] pooler we never use: skip building it
        return auto.from_pretrained(path, add_pooling_layer=False, **kwargs)
    except TypeError:
        return auto.from_pretrained(path, **kwargs)


def _check_choice(
    what: str, value: str, allowed: tuple[str, ...], model_id: str
) -> None:
    if value not in allowed:
        msg = f"{model_id}: {what} {value!r} is not one of {', '.join(allowed)}"
        raise AdapterOptionError(msg)
