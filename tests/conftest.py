"""Shared fixtures: offline hub, caches in tmp, no progress bars, tiny random models."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# Set before anything imports huggingface_hub, which reads these once at import time.
_HF_HOME = Path(tempfile.mkdtemp(prefix="embedcache-hf-home-"))
atexit.register(shutil.rmtree, _HF_HOME, ignore_errors=True)
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HOME"] = str(_HF_HOME)
os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
os.environ["TQDM_DISABLE"] = "1"

DNA_CHARS = "ACGTN"
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _offline_hub(monkeypatch, tmp_path_factory):
    """Every test: hub offline, HF caches in tmp, progress bars off (also for subprocesses)."""
    home = tmp_path_factory.getbasetemp() / "hf-home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.setenv("TQDM_DISABLE", "1")
    try:
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover - huggingface_hub is a dependency
        return
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))


def make_kmer3_tokenizer():
    """A DNABERT-like tokenizer: whitespace-split 3-mer words, [CLS]/[SEP] specials.

    Returns the tokenizer and its vocabulary (specials at ids 0-4).
    """
    from itertools import product

    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])}
    for kmer in product("ACGT", repeat=3):
        vocab["".join(kmer)] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    return tokenizer, vocab


def make_dna_tokenizer(*, style: str = "bert", model_max_length: int | None = None):
    """A character-level DNA tokenizer (one token per base) with [CLS]/[SEP]-style specials.

    ``BertTokenizerFast(vocab_file=...)`` ignores the file in transformers 5, so this
    builds a ``tokenizers`` WordLevel model and wraps it (see FACTS.md).
    """
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    if style == "bert":
        specials = {
            "pad": "[PAD]",
            "unk": "[UNK]",
            "cls": "[CLS]",
            "sep": "[SEP]",
            "mask": "[MASK]",
        }
        order = ["pad", "unk", "cls", "sep", "mask"]
    else:  # esm: <cls> first, <pad> at 1 as in ESM / Nucleotide Transformer
        specials = {
            "cls": "<cls>",
            "pad": "<pad>",
            "sep": "<eos>",
            "unk": "<unk>",
            "mask": "<mask>",
        }
        order = ["cls", "pad", "sep", "unk", "mask"]
    vocab = {specials[name]: i for i, name in enumerate(order)}
    for char in DNA_CHARS:
        vocab[char] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=specials["unk"]))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    cls, sep = specials["cls"], specials["sep"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {sep} $B {sep}",
        special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])],
    )
    kwargs = {"model_max_length": model_max_length} if model_max_length else {}
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token=specials["unk"],
        pad_token=specials["pad"],
        cls_token=cls,
        sep_token=sep,
        mask_token=specials["mask"],
        **kwargs,
    )


def save_tiny_model(
    path: Path,
    tokenizer,
    config_cls: type,
    model_cls: type,
    /,
    *,
    model_options: dict | None = None,
    **fields,
) -> Path:
    """Save a random-initialised 2-layer, hidden-16 ``model_cls`` and ``tokenizer``.

    ``fields`` go to ``config_cls`` beside the tiny sizes, ``model_options`` to
    ``model_cls``; the weights come from ``torch.manual_seed(0)``.
    """
    import torch

    config = config_cls(
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        **fields,
    )
    torch.manual_seed(0)
    model_cls(config, **(model_options or {})).eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def save_tiny_bert(path: Path, *, max_position_embeddings: int = 64) -> Path:
    """Random-initialised 2-layer, hidden-16 BERT over the character vocabulary."""
    from transformers import BertConfig, BertModel

    tokenizer = make_dna_tokenizer(style="bert")
    return save_tiny_model(
        path,
        tokenizer,
        BertConfig,
        BertModel,
        vocab_size=len(tokenizer),
        max_position_embeddings=max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
    )


def save_tiny_esm(path: Path, *, model_max_length: int = 48) -> Path:
    """Random-initialised 2-layer, hidden-16 ESM with rotary positions (NT-v2 style)."""
    from transformers import EsmConfig, EsmModel

    tokenizer = make_dna_tokenizer(style="esm", model_max_length=model_max_length)
    return save_tiny_model(
        path,
        tokenizer,
        EsmConfig,
        EsmModel,
        vocab_size=len(tokenizer),
        max_position_embeddings=model_max_length + 2,
        position_embedding_type="rotary",
        pad_token_id=tokenizer.pad_token_id,
        mask_token_id=tokenizer.mask_token_id,
        token_dropout=False,
        emb_layer_norm_before=False,
        model_options={"add_pooling_layer": False},
    )


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def tiny_esm_dir(tmp_path_factory) -> Path:
    return save_tiny_esm(tmp_path_factory.mktemp("tiny-esm"))
