"""Build the GENA-LM equality fixtures in tests/fixtures/gena/ with the official code.

The official code is ``src/gena_lm/modeling_bert.py`` of AIRI-Institute/GENA_LM on
GitHub (the hub repositories AIRI-Institute/gena-lm-bert-{base,large}-t2t ship the
same module as their remote code). It is not committed: pass a directory holding it
and the GitHub commit it came from. It runs as a user runs it, beside ``config.json``
and loaded with ``trust_remote_code=True``, in a scratch environment (transformers
4.3x-4.4x; the fixtures were made with 4.38.2)::

    python3 -m venv /tmp/ntv2gena-ref
    /tmp/ntv2gena-ref/bin/pip install torch==2.13.0 transformers==4.38.2 safetensors numpy
    git -C GENA_LM show 4a884630dd72fac47775a256f9c85452b63d28e3:src/gena_lm/modeling_bert.py \\
        > /tmp/gena-official/modeling_bert.py
    HF_HOME=/tmp/ntv2gena-hfhome /tmp/ntv2gena-ref/bin/python scripts/make_gena_fixtures.py \\
        --official /tmp/gena-official --official-commit 4a884630dd72fac47775a256f9c85452b63d28e3 \\
        --published-tokenizer GENA_LM/data/tokenizers/t2t_1000h_multi_32k/tokenizer.json \\
        --out tests/fixtures/gena

The published tokenizer (32,000 BPE tokens, 1.4 MB) is too large to commit, so each
fixture carries a small BPE trained here on random DNA with everything else of the
published ``tokenizer.json`` (added tokens [UNK] [CLS] [SEP] [PAD] [MASK] - at 0-5, the
Strip + ``N{10,}`` -> ``-`` normaliser, the ``-`` split pre-tokeniser, the BERT
post-processor, the decoder); ``--published-tokenizer`` checks that they are equal.

What it writes, per model: ``<name>/`` in the hub layout (``config.json`` with the
published fields, ``model_type: bert`` and ``auto_map`` {AutoModel:
modeling_bert.BertForMaskedLM}; ``pytorch_model.bin`` of a ``BertForMaskedLM`` whose
every weight was moved off its initial value; ``tokenizer.json``,
``tokenizer_config.json``, ``special_tokens_map.json``), and in ``expected.npz`` the
official model's vectors for ``sequences.txt``.

- ``gena_base``: as gena-lm-bert-base-t2t: ``pre_layer_norm: true``,
  ``last_layer_norm: false``, ``layer_norm_eps`` 1e-12.
- ``gena_lastln``: as gena-lm-bert-large-t2t's published training config: no
  ``last_layer_norm`` field (the official default then adds the final ``last_layer_ln``),
  ``layer_norm_eps`` 1e-5.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dna_fixture_sequences import fixture_sequences
from fixture_writer import (
    AVERAGE_UPPER,
    library_versions,
    perturb,
    pooled_views,
    pooling_note,
    record_official_vectors,
    save_hub_layout,
    write_fixtures,
)

PUBLISHED = Path(
    "tests/fixtures/gena/published/gena-lm-bert-base-t2t.config-printout.json"
)
# the published tokenizer lists "-" (what a run of 10+ N becomes) as a special added
# token too, at id 5
SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]", "-"]
SPECIAL_TOKENS_MAP = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}
VARIANTS = {
    "gena_base": {
        "hidden_size": 16,
        "num_attention_heads": 2,
        "num_hidden_layers": 2,
        "intermediate_size": 32,
        "max_position_embeddings": 160,
        "last_layer_norm": False,
        "layer_norm_eps": 1e-12,
    },
    "gena_lastln": {
        "hidden_size": 24,
        "num_attention_heads": 4,
        "num_hidden_layers": 3,
        "intermediate_size": 48,
        "max_position_embeddings": 160,
        "last_layer_norm": None,  # field absent, as in the large model's config
        "layer_norm_eps": 1e-5,
    },
}


def train_tokenizer(vocab_size: int = 160):  # noqa: ANN201 - tokenizers is not typed here
    """A small BPE over A, C, G, T, N and '-', dressed as the published tokenizer."""
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    rng = random.Random(7)
    motifs = ["TATAAA", "CCAAT", "GGGCGG", "TTAGGG", "CACGTG", "AATAAA"]
    corpus = []
    for _ in range(3000):
        parts = []
        while sum(map(len, parts)) < 120:
            parts.append(
                rng.choice(motifs)
                if rng.random() < 0.3
                else rng.choice("ACGT") * rng.randint(1, 3)
            )
            if rng.random() < 0.02:
                parts.append("N" * rng.randint(1, 4))
        corpus.append("".join(parts))
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.normalizer = normalizers.Sequence(
        [normalizers.Strip(), normalizers.Replace(Regex("N{10,}"), "-")]
    )
    tok.pre_tokenizer = pre_tokenizers.Split("-", behavior="isolated")
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=["A", "C", "G", "N", "T"],
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    tok.post_processor = processors.BertProcessing(("[SEP]", 2), ("[CLS]", 1))
    tok.decoder = decoders.BPEDecoder(suffix=" ")
    return tok


def check_like_published(ours: dict, published: Path) -> None:
    theirs = json.loads(published.read_text())
    for key in (
        "normalizer",
        "pre_tokenizer",
        "post_processor",
        "decoder",
        "truncation",
        "padding",
    ):
        if ours[key] != theirs[key]:
            msg = f"tokenizer.json {key}: ours {ours[key]} differs from the published {theirs[key]}"
            raise SystemExit(msg)
    if ours["added_tokens"] != theirs["added_tokens"]:
        msg = "tokenizer.json added_tokens differ from the published ones"
        raise SystemExit(msg)
    for key in (
        "type",
        "unk_token",
        "continuing_subword_prefix",
        "end_of_word_suffix",
        "fuse_unk",
    ):
        if ours["model"].get(key) != theirs["model"].get(key):
            msg = f"tokenizer.json model.{key} differs from the published one"
            raise SystemExit(msg)


def padded_batch(tokenizer, seqs: list[str]) -> tuple:  # noqa: ANN001
    """The official tokenizer's padded batch of ``seqs`` and its special-token mask."""
    batch = tokenizer(
        seqs, return_tensors="pt", padding=True, return_special_tokens_mask=True
    )
    return batch, batch.pop("special_tokens_mask").bool()


def pooled(model, tokenizer, seq: str) -> dict:  # noqa: ANN001
    """The official model's pooled vectors of one sequence (no padding involved)."""
    import torch

    enc = tokenizer(seq, return_tensors="pt", return_special_tokens_mask=True)
    keep = ~enc.pop("special_tokens_mask")[0].bool()
    with torch.no_grad():
        states = model(**enc, output_hidden_states=True).hidden_states
    return pooled_views(states, keep)


def published_counts(
    code: Path, template: dict, scratch: Path
) -> dict[str, dict[str, int]]:
    """Parameter counts of the official model built from each published config: all
    of ``BertForMaskedLM``, and the encoder tensors embedcache keeps (``bert.*``)."""
    from transformers import AutoConfig, AutoModel

    out = {}
    for path in sorted(PUBLISHED.parent.glob("*.json")):
        published = json.loads(path.read_text())
        published.pop("_name_or_path", None)
        published["auto_map"] = template["auto_map"]  # the code to build it with
        folder = scratch / ("published_" + path.name.split(".")[0].replace("-", "_"))
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(published))
        shutil.copy(code, folder / "modeling_bert.py")
        config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
        model = AutoModel.from_config(config, trust_remote_code=True)
        kept = sum(
            p.numel() for n, p in model.named_parameters() if n.startswith("bert.")
        )
        total = sum(p.numel() for p in model.parameters())
        out[path.name] = {"total": total, "encoder_kept": kept}
        print(path.name, out[path.name])
        del model
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--official", type=Path, required=True)
    parser.add_argument("--official-commit", required=True)
    parser.add_argument("--published-tokenizer", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    code = args.official / "modeling_bert.py"
    code_sha = hashlib.sha256(code.read_bytes()).hexdigest()

    import numpy as np
    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    printout = json.loads(PUBLISHED.read_text())
    template = {k: v for k, v in printout.items() if k != "_name_or_path"}
    # the loader prefixes auto_map with the repository; the file itself does not
    template["auto_map"] = {"AutoModel": "modeling_bert.BertForMaskedLM"}
    sequences = fixture_sequences()
    upper = [s.upper() for s in sequences]
    tok = train_tokenizer()
    tok_json = json.loads(tok.to_str())
    check_like_published(tok_json, args.published_tokenizer)
    args.out.mkdir(parents=True, exist_ok=True)
    expected: dict[str, np.ndarray] = {}
    tokens: dict[str, list[list[int]]] = {}
    scratch = Path(tempfile.mkdtemp(prefix="ntv2gena-genaref-"))
    for seed, (name, values) in enumerate(VARIANTS.items()):
        config_dict = dict(template)
        for key, value in values.items():
            if value is None:
                config_dict.pop(key)
            else:
                config_dict[key] = value
        config_dict["vocab_size"] = tok.get_vocab_size()

        build = scratch / f"{name}-build"
        build.mkdir()
        (build / "config.json").write_text(json.dumps(config_dict, indent=2) + "\n")
        shutil.copy(code, build / "modeling_bert.py")
        config = AutoConfig.from_pretrained(build, trust_remote_code=True)
        torch.manual_seed(10 + seed)
        model = AutoModel.from_config(config, trust_remote_code=True)
        assert type(model).__name__ == "BertForMaskedLM", type(model)
        perturb(model, lambda n: 0.3 if "ln" in n or "LayerNorm" in n else 0.2)

        out_dir = args.out / name
        save_hub_layout(model, out_dir, config_dict, safe=False)
        (out_dir / "generation_config.json").unlink(missing_ok=True)  # not on the hub
        tok.save(str(out_dir / "tokenizer.json"))
        (out_dir / "tokenizer_config.json").write_text(
            json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"})
        )
        (out_dir / "special_tokens_map.json").write_text(json.dumps(SPECIAL_TOKENS_MAP))

        run = scratch / f"{name}-run"
        shutil.copytree(out_dir, run)
        shutil.copy(code, run / "modeling_bert.py")
        loaded = AutoModel.from_pretrained(run, trust_remote_code=True).eval()
        tokenizer = AutoTokenizer.from_pretrained(run)
        assert type(loaded).__module__.endswith("modeling_bert"), type(
            loaded
        ).__module__
        has_last_ln = hasattr(loaded.bert.encoder, "last_layer_ln")
        assert has_last_ln == (name == "gena_lastln"), has_last_ln

        record_official_vectors(
            name,
            loaded,
            tokenizer,
            upper,
            pool=functools.partial(pooled, loaded, tokenizer),
            padded_batch=functools.partial(padded_batch, tokenizer),
            expected=expected,
            tokens=tokens,
        )
        print(
            f"{name} -> {out_dir}: hidden {config.hidden_size}, vocab {config.vocab_size}"
        )

    meta = {
        "official_code": "AIRI-Institute/GENA_LM src/gena_lm/modeling_bert.py",
        "official_commit": args.official_commit,
        "official_sha256": code_sha,
        "published_tokenizer_sha256": hashlib.sha256(
            args.published_tokenizer.read_bytes()
        ).hexdigest(),
        "published_config": "tests/fixtures/gena/published/gena-lm-bert-base-t2t.config-printout.json",
        **library_versions(),
        "loaded_with": "AutoModel.from_pretrained(dir, trust_remote_code=True) -> BertForMaskedLM",
        "tokenizer": "AutoTokenizer (PreTrainedTokenizerFast on tokenizer.json), upper-cased input",
        "pooling": pooling_note(
            "hidden_states[-1], [CLS]/[SEP] excluded (special_tokens_mask)"
        ),
        "average": AVERAGE_UPPER,
    }
    meta["published_param_counts"] = published_counts(code, template, scratch)
    write_fixtures(
        args.out, expected=expected, sequences=sequences, meta=meta, tokens=tokens
    )
    shutil.rmtree(scratch)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
