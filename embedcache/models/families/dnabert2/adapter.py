"""DNABERT-2 and DNABERT-S (MosaicBERT) without their remote code.

The published checkpoints (zhihan1996/DNABERT-2-117M, zhihan1996/DNABERT-S) ship
``bert_layers.py`` and an ``auto_map`` pointing at it; their config says
``model_type: bert`` (DNABERT-S, DNABERT-2 before 2024-02) or names no model type at
all (DNABERT-2 since). Loaded as native BERT they would silently get random attention
and feed-forward weights, so they are recognised here first, from the config (an
``auto_map`` into ``bert_layers`` plus MosaicBERT's ``alibi_starting_size``) or, without
an ``auto_map``, from the weight names (``Wqkv``, ``gated_layers``), and loaded into
:mod:`.network` strictly: every tensor of the encoder must be there, and no
other may be (the masked-LM head, the pooler and a classifier are left out).

No repository code runs. A ``bert_layers.py`` beside the weights is read only to check
it is one of the official versions: a modified copy (a public one swaps ALiBi for
rotary embeddings, with the same weight names) is refused rather than loaded as
MosaicBERT, unless the user passes ``--trust-remote-code`` to run that code.

Tokens are the published BPE (``tokenizer.json``, read with ``tokenizers``): [CLS], the
sequence's tokens, [SEP]; an N (or any letter outside the vocabulary) becomes [UNK].
The vector is the mean over the sequence's own tokens of the last block's output.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import TYPE_CHECKING, Any

from embedcache.errors import AdapterOptionError, CheckpointError
from embedcache.models.shared.checkpoint import (
    TOKENIZER_CONFIG,
    Source,
    auto_map_targets,
    compute_dtype,
    fill_weights,
)
from embedcache.models.shared.encoder import EncoderAdapter, EncoderTraits
from embedcache.models.shared.tokenizer_json import JsonTokenizer, read_tokenizer_json

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from embedcache.models.base import Adapter

logger = logging.getLogger(__name__)

FAMILY = "dnabert2"
# 2: each sequence padded to the bucket of its own length, not its batch's
# longest (issue 43): fp32 bits changed; now the same in any batch
ADAPTER_VERSION = "2"
# tensors of the published checkpoints that the embedding never uses: the masked-LM
# head (DNABERT-2), the [CLS] pooler (DNABERT-S), a fine-tuned classifier
HEADS = ("cls.", "classifier.", "pooler.", "bert.pooler.")
# weight names only MosaicBERT has (native BERT has query/key/value and intermediate)
_MOSAIC_WEIGHTS = (".attention.self.Wqkv.weight", ".mlp.gated_layers.weight")
# sha256 of every official bert_layers.py: the DNABERT-2 hub repository's versions from
# 2023-06 to 2024-03 (same arithmetic; they differ in imports, base classes and heads),
# which is also the code of revision 7bce263b, and DNABERT-S's hub file at 00e47f96
# (40,807 bytes; its hash is on public record, its text is not)
OFFICIAL_CODE_SHA256 = frozenset(
    {
        "6eeed907cb39fb7354a24c5434b057304d3acedcde50e99c7ed66a3398f210e3",
        "bd82e7b7c65b79c1198cb18585261470d29d972fd98897972cc9c8d1f51ecb71",
        "b67badfb0479166881a88d49ea851faef77766a5f814997d4f7c48657a31b82c",
        "089e5d47229fa2784439d003cee93e45af6946d662dd1280b49d83dd93a58e36",
        "76489bf6eccd75841a2fa0767c0e8f42bf755c0a644fb1f9e1660a06d81f202a",
        "fe77f98d116cf35680c5158e962af1783f6c2cbd57b3b086aa33f39fadbccac3",
        "ea61428dcf56decd451b46c4b8e522c17be95ec277c6842b007401552ce37e95",
        "c0d6406e1485156d96cfd837999936ea20f25bbda7cfedf9a2318641abc321ec",
        "f894ddcdefa141a8e8fc8351824726b7acbb591ccc6a534181eb9dee2633c75b",
        "317ad7e9667980ac724c07f0174ba265c8446ca5230f6b473068ff1b911edcf9",
        "cd2fe0efbb90db624fe4e25aa96bd049513e81740ba3f980163c385e894df561",
    }
)
CODE_FILE = "bert_layers.py"


def is_mosaic_bert_config(config: Mapping[str, Any]) -> bool:
    """Whether a config is MosaicBERT's (DNABERT-2 / DNABERT-S) by its fields alone."""
    if "alibi_starting_size" not in config:
        return False
    return any(target.startswith("bert_layers.") for target in auto_map_targets(config))


def recognise(config: dict[str, Any], folder: Path) -> bool:
    """A DNABERT-2/DNABERT-S checkpoint: MosaicBERT's config, or (without an
    ``auto_map``) a config with ``alibi_starting_size`` whose weights are MosaicBERT's."""
    if is_mosaic_bert_config(config):
        return True
    if "alibi_starting_size" not in config or config.get("auto_map"):
        return False
    from embedcache.models.shared.weights import weight_names

    try:
        names = weight_names(folder)
    except CheckpointError:
        return False
    return any(name.endswith(_MOSAIC_WEIGHTS) for name in names)


class DnabertTokenizer(JsonTokenizer):
    """The published ``tokenizer.json`` (BPE), checked to be DNABERT-2's: a padding
    token, and [CLS] ... [SEP] around a sequence."""

    def __init__(self, folder: Path, *, where: str) -> None:
        path = folder / "tokenizer.json"
        tokenizer = read_tokenizer_json(
            folder,
            missing=(
                f"{where} has no tokenizer.json; DNABERT-2 and DNABERT-S ship their BPE "
                "tokenizer as tokenizer.json beside the weights: copy it there"
            ),
            unreadable=f"cannot read {path} as a tokenizers BPE file",
        )
        pad = tokenizer.token_to_id(_pad_token(folder))
        if pad is None:
            msg = (
                f"{path} has no padding token ([PAD]); it is not DNABERT-2's tokenizer"
            )
            raise CheckpointError(msg)
        super().__init__(tokenizer, pad_id=int(pad))
        probe = self.encode("A")
        if not (probe.special[0] and probe.special[-1]) or len(probe) < 3:
            msg = (
                f"{path} does not wrap a sequence as [CLS] ... [SEP] (got ids "
                f"{list(probe.ids)}); it is not DNABERT-2's tokenizer"
            )
            raise CheckpointError(msg)
        self.cls_id = probe.ids[0]


def _pad_token(folder: Path) -> str:
    """The padding token tokenizer_config.json names, else DNABERT-2's [PAD]."""
    path = folder / TOKENIZER_CONFIG
    try:
        pad = json.loads(path.read_text(encoding="utf-8")).get("pad_token")
    except (OSError, ValueError, AttributeError):
        return "[PAD]"
    if isinstance(pad, dict):  # AddedToken serialised
        pad = pad.get("content")
    return pad if isinstance(pad, str) and pad else "[PAD]"


def official_code_check(folder: Path) -> str | None:
    """None if ``folder`` holds no ``bert_layers.py`` or an official one, else its sha256."""
    path = folder / CODE_FILE
    if not path.is_file():
        return None
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return None if digest in OFFICIAL_CODE_SHA256 else digest


def _encoder_state(state: dict[str, Any]) -> dict[str, Any]:
    """The encoder's tensors: ``bert.`` removed where the checkpoint has it, heads
    dropped."""
    from embedcache.models.shared.weights import strip_prefix

    prefix = "bert." if any(k.startswith("bert.") for k in state) else ""
    return strip_prefix(state, prefix, ignore=HEADS)


def load(source: Source) -> Adapter:
    """A DNABERT-2/DNABERT-S adapter from an official-layout folder.

    Raises
    ------
    CheckpointError
        The config, tokenizer or weights do not fit MosaicBERT, or the folder's
        ``bert_layers.py`` is not an official version (and remote code is not trusted).
    AdapterOptionError
        A family option was given (this family has none).
    """
    from embedcache.models.families.dnabert2.network import (
        MosaicBertNetwork,
        arch_from_config,
    )

    folder, config, options = source.folder, source.config, source.options
    name = source.alias or source.model_id
    unknown_code = official_code_check(folder)
    if unknown_code is not None:
        if options.trust_remote_code:
            from embedcache.models.families.hf import adapter as hf

            logger.info(
                "%s: %s is not an official version; running it (--trust-remote-code)",
                name,
                CODE_FILE,
            )
            return hf.load(source)
        msg = (
            f"{folder / CODE_FILE} (sha256 {unknown_code}) is none of the official "
            "DNABERT-2/DNABERT-S versions embedcache checked its MosaicBERT against; it "
            "may compute something else with the same weights (a public copy swaps ALiBi "
            "for rotary embeddings). Pass --trust-remote-code to run that file as it is, "
            "or, if it is the official code with cosmetic edits, remove it from the "
            "folder (embedcache never runs it) to load the weights into embedcache's "
            "MosaicBERT."
        )
        raise CheckpointError(msg)
    if options.family_options:
        msg = (
            f"{name} ({FAMILY}): --family-option "
            f"{', '.join(k for k, _ in options.family_options)} does not apply; "
            "DNABERT-2 has no family options"
        )
        raise AdapterOptionError(msg)
    arch = arch_from_config(config, where=str(folder / "config.json"))
    tokenizer = DnabertTokenizer(folder, where=str(folder))
    network = MosaicBertNetwork(arch)
    source, key_options = fill_weights(
        network,
        source,
        init=lambda net, seed: net.reset_parameters(seed=seed),
        state=_encoder_state,
        family=FAMILY,
    )
    dtype = compute_dtype(options)
    network = network.to(device=source.device, dtype=dtype).eval()
    network = network.requires_grad_(False)
    # ALiBi has no position table: the official code takes any length (no max)
    traits = EncoderTraits.bidirectional(
        FAMILY, ADAPTER_VERSION, key_options, None, arch.n_heads
    )
    return EncoderAdapter(tokenizer, network, traits, source)


__all__ = [
    "ADAPTER_VERSION",
    "FAMILY",
    "OFFICIAL_CODE_SHA256",
    "DnabertTokenizer",
    "is_mosaic_bert_config",
    "load",
    "official_code_check",
    "recognise",
]
