"""Model shapes for the benchmarks: folders in a published layout with random weights,
the ``embedcache embed`` options that load them, and the test sequences they run on.
(GENA-LM's, which trains a BPE: ``git show d105fc3:benchmarks/shapes.py``.)"""

from __future__ import annotations

import itertools
import json
import shutil
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
# ../shared/data beside the checkout (a worktree looks further up)
DATA = next(
    (d for p in REPO.parents if (d := p / "shared/data/genomic-benchmarks").is_dir()),
    REPO.parent / "shared/data/genomic-benchmarks",
)
FIXTURES = REPO / "tests" / "fixtures"
BERT_SPECIALS = {
    f"{t}_token": f"[{t.upper()}]" for t in ("pad", "unk", "cls", "sep", "mask")
}
ESM_SPECIALS = {f"{t}_token": f"<{t}>" for t in ("unk", "pad", "mask", "cls", "eos")}


def load_sequences(
    n: int,
    seed: int = 0,
    *,
    datasets: Sequence[str] | None = None,
    lengths: Sequence[int] = (251, 500),
) -> tuple[list[str], str]:
    """``n`` test sequences, an equal part from each of ``datasets`` (default: every
    published test set here), shuffled; random ones of ``lengths`` without the data."""
    rng = np.random.default_rng(seed)
    names = datasets or sorted(p.parent.name for p in DATA.glob("*/test.tsv"))
    files = [DATA / name / "test.tsv" for name in names]
    if not files or not all(f.exists() for f in files):
        seqs = random_sequences(rng, rng.choice(list(lengths), size=n))
        about = "/".join(map(str, lengths))
        return seqs, f"{n} random sequences ({about} bp; shared data absent)"
    import polars as pl

    seqs: list[str] = []
    for path in files:
        column = pl.read_csv(path, separator="\t")["seq"]
        k = min(-(-n // len(files)), len(column))  # an equal part of each
        rows = rng.choice(len(column), size=k, replace=False)
        seqs += column.gather(rows).str.to_uppercase().to_list()
    rng.shuffle(seqs)  # the naive loop must not profit from sorted input
    seqs = seqs[:n]
    return seqs, f"{len(seqs)} real test sequences from {', '.join(names)}"


def random_sequences(rng: np.random.Generator, lengths: Sequence[int]) -> list[str]:
    """Random ACGT sequences of ``lengths``."""
    return ["".join(rng.choice(list("ACGT"), size=int(m))) for m in lengths]


def _save_fast_tokenizer(
    path: Path, vocab: dict[str, int], split: str, template: str, **special: str
) -> None:
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=special["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(split), behavior="isolated")
    used = [t for t in vocab if t.startswith(("[", "<")) and t in template]
    tok.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[(t, vocab[t]) for t in used]
    )
    PreTrainedTokenizerFast(
        tokenizer_object=tok, model_max_length=1024, **special
    ).save_pretrained(path)


def build_bert_char(path: Path, *, width: int = 512, layers: int = 8) -> None:
    """A BERT (512-wide, 8 layers by default), one token per base, random weights."""
    from transformers import BertConfig, BertModel

    vocab = {t: i for i, t in enumerate([*BERT_SPECIALS.values(), *"ACGTN"])}
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=width // 64,
        intermediate_size=4 * width,
        max_position_embeddings=1024,
    )
    torch.manual_seed(0)
    BertModel(config, add_pooling_layer=False).eval().save_pretrained(path)
    _save_fast_tokenizer(path, vocab, ".", "[CLS] $A [SEP]", **BERT_SPECIALS)


def build_model(path: Path) -> None:
    """A stock ``EsmModel`` shaped like NT-v2 50m (GELU feed-forward, not gated) with
    NT's 6-mer rule; random weights (serve_bench's default model)."""
    from transformers import EsmConfig, EsmModel

    kmers = ["".join(k) for k in itertools.product("ACGT", repeat=6)]
    specials = [*ESM_SPECIALS.values(), "<bos>"]
    vocab = {t: i for i, t in enumerate([*specials, *kmers, *"ACGTN"])}
    config = EsmConfig(
        vocab_size=len(vocab),
        hidden_size=512,
        num_hidden_layers=12,
        num_attention_heads=16,
        intermediate_size=2048,
        max_position_embeddings=2050,
        position_embedding_type="rotary",
        pad_token_id=vocab["<pad>"],
        mask_token_id=vocab["<mask>"],
        token_dropout=False,
        emb_layer_norm_before=False,
        layer_norm_eps=1e-12,
    )
    torch.manual_seed(0)
    EsmModel(config, add_pooling_layer=False).eval().save_pretrained(path)
    _save_fast_tokenizer(path, vocab, "[ACGT]{6}|.", "<cls> $A", **ESM_SPECIALS)


def build_ntv2_50m(path: Path) -> None:
    """NT-v2 50m's published config and vocabulary (weights: the family's init)."""
    fixtures = FIXTURES / "ntv2"
    name = "nucleotide-transformer-v2-50m-multi-species.config.json"
    shutil.copy(fixtures / "published" / name, path / "config.json")
    for file in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(fixtures / "ntv2" / file, path / file)


def build_dnabert2(path: Path) -> None:
    """DNABERT-2-117M's published config.json and BPE tokenizer."""
    fixtures = FIXTURES / "dnabert2"
    shutil.copy(
        fixtures / "published" / "dnabert2_117m_config.json", path / "config.json"
    )
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(fixtures / "dnabert2" / name, path / name)


def build_generator(path: Path) -> None:
    """GENERator-1.2b's published config (width 2048, FFN 5632, 32 heads, 4 KV heads)
    at 4 of its 26 blocks."""
    config = json.loads((FIXTURES / "generator/published/config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 4}))


def build_caduceus_ph(path: Path) -> None:
    """Caduceus-ph's shape (d_model 256, 16 layers), from the shipped tiny config; its
    weights come from the family's own init (``--random-init``, the official kinds)."""
    shipped = REPO / "embedcache" / "models" / "architectures" / "caduceus-tiny"
    config = json.loads((shipped / "config.json").read_text())
    config |= {"d_model": 256, "n_layer": 16, "residual_in_fp32": False}
    (path / "config.json").write_text(json.dumps(config))


def build_hyena_medium(path: Path) -> None:
    """HyenaDNA medium-160k's shape (d_model 256, 8 layers, d_inner 1024, max_seq_len
    160002): the published small-32k config with medium's depth and length."""
    fixture = FIXTURES / "hyena" / "published_small32k_finetune_config.json"
    drop = {"id2label", "label2id", "problem_type", "dtype", "transformers_version"}
    config = {k: v for k, v in json.loads(fixture.read_text()).items() if k not in drop}
    config |= {
        "architectures": ["HyenaDNAForCausalLM"],
        "n_layer": 8,
        "max_seq_len": 160002,
    }
    (path / "config.json").write_text(json.dumps(config))


@dataclass(frozen=True)
class Shape:
    """A model folder to write and the ``embedcache embed`` options that load it."""

    about: str
    build: Callable[[Path], None]
    options: tuple[str, ...] = ()


RANDOM_INIT = ("--random-init", "0")
SHAPES = {
    "bert-char-512x8": Shape("BERT 512 x 8 layers, one token per base", build_bert_char),
    "bert-char-256x4": Shape("BERT 256 x 4 layers, one token per base",
                             partial(build_bert_char, width=256, layers=4)),
    "ntv2-50m": Shape("NT-v2 50m (published config, 6-mers)", build_ntv2_50m, RANDOM_INIT),
    "dnabert2-117m": Shape("DNABERT-2-117M (published config, BPE)", build_dnabert2, RANDOM_INIT),
    "generator-1.2b-4l": Shape("GENERator 1.2b width, 4 blocks", build_generator, RANDOM_INIT),
    "esm-6mer-512x12": Shape("stock ESM shaped like NT-v2 50m", build_model),
    "caduceus-ph": Shape("Caduceus-ph shape, RC average", build_caduceus_ph,
                         (*RANDOM_INIT, "--rc", "average")),
    "hyena-medium-160k": Shape("HyenaDNA medium-160k shape", build_hyena_medium, RANDOM_INIT),
}  # fmt: skip


def adapter_options(shape: Shape) -> dict[str, object]:
    """The shape's CLI options as :func:`load_adapter` keywords."""
    pairs = dict(zip(shape.options[::2], shape.options[1::2], strict=True))
    rc = {"rc_mode": pairs["--rc"]} if "--rc" in pairs else {}
    return {"random_init": int(pairs["--random-init"])} | rc if pairs else {}
