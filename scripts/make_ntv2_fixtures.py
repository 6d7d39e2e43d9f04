"""Build the NT-v2 equality fixtures in tests/fixtures/ntv2/ with the official hub code.

The official code is the hub's ``modeling_esm.py`` + ``esm_config.py`` of
InstaDeepAI/nucleotide-transformer-v2-*-multi-species. They are not committed; pass a
directory holding them. This script refuses files whose sha256 differs from the hub's
(revision 81b29e5786726d891dbf929404ef20adca5b36f1 of the 50m repository, as pinned
in kurtvalcorza/nucleotide-transformer-genomics-pipeline's dimer-base-manifest.json).
A public copy: SeedLLM/molly, commit 62330f73df2a97af53bc176ebc2b3ff76558542f,
``src/model/esm_config.py`` (identical to the hub file) and ``src/model/modeling_esm.py``
(an earlier hub revision: it imports ``find_pruneable_heads_and_indices`` and
``prune_linear_layer`` from ``transformers.modeling_utils``; the hub file at 81b29e57
imports them from ``transformers.pytorch_utils``, one line, and nothing else differs:
with that import moved the copy hashes to the hub's sha256).

The code runs exactly as a user runs it: the files are placed beside ``config.json``
and loaded with ``trust_remote_code=True`` in a scratch environment (transformers 4.3x;
the fixtures were made with 4.38.2)::

    python3 -m venv /tmp/ntv2gena-ref
    /tmp/ntv2gena-ref/bin/pip install torch==2.13.0 transformers==4.38.2 safetensors numpy
    HF_HOME=/tmp/ntv2gena-hfhome /tmp/ntv2gena-ref/bin/python scripts/make_ntv2_fixtures.py \\
        --official /path/to/dir/with/modeling_esm.py --out tests/fixtures/ntv2

What it writes, per model: ``<name>/`` in the hub layout (``config.json`` with the
published 50m config's fields, ``auto_map`` included and no ``model_type``;
``model.safetensors`` of an ``EsmForMaskedLM`` whose every weight was moved off its
initial value; ``vocab.txt``, ``tokenizer_config.json``, ``special_tokens_map.json``),
and in ``expected.npz`` the official model's vectors for ``sequences.txt``.

- ``ntv2``: the published vocabulary (4,107 tokens: ``vocab.txt`` is generated and must
  hash to the hub file) and ``add_bias_fnn: false`` as published; hidden size 8.
- ``ntv2_3mer_bias``: ``add_bias_fnn: true`` and a 3-mer vocabulary (specials, 64
  3-mers, single bases), to exercise the feed-forward biases and a tokenizer that
  follows its ``vocab.txt`` rather than a fixed k.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dna_fixture_sequences import fixture_sequences
from fixture_writer import (
    AVERAGE_UPPER,
    library_versions,
    parse_fixture_args,
    perturb,
    pooled_views,
    pooling_note,
    record_official_vectors,
    save_hub_layout,
    write_fixtures,
)

HUB_REVISION = "81b29e5786726d891dbf929404ef20adca5b36f1"
HUB_SHA256 = {
    "modeling_esm.py": "f2b003f45d2fa4f94e92d8bbef927b719dfdd7ab7c7a95743daa2b10ab140cb3",
    "esm_config.py": "a44e859baa08465ecdcd76b0a73f6e4fe011245a212931c403de1149ae9613ec",
    "vocab.txt": "c00e0ad166d6ab3f7540ebc92270392e581bb3106763412f29034b49323e1052",
    "tokenizer_config.json": "253d338919eba938e50b776f3243cc739462c207fe64e3d2e81cc5e681bee45b",
    "special_tokens_map.json": "d6dc30bf018166daab248b0abf7efda6fd1b1e0a2d1bee5b31b23db2ebdaee77",
}
PUBLISHED = Path(
    "tests/fixtures/ntv2/published/nucleotide-transformer-v2-50m-multi-species.config.json"
)
SPECIALS = ["<unk>", "<pad>", "<mask>", "<cls>", "<eos>", "<bos>"]
TOKENIZER_CONFIG = {
    "clean_up_tokenization_spaces": True,
    "eos_token": None,
    "model_max_length": 2048,
    "tokenizer_class": "EsmTokenizer",
}
SPECIAL_TOKENS_MAP = {
    "cls_token": "<cls>",
    "mask_token": "<mask>",
    "pad_token": "<pad>",
    "unk_token": "<unk>",
}
VARIANTS = {
    "ntv2": {
        "k": 6,
        "hidden_size": 8,
        "num_attention_heads": 2,
        "num_hidden_layers": 2,
        "intermediate_size": 12,
        "add_bias_fnn": False,
    },
    "ntv2_3mer_bias": {
        "k": 3,
        "hidden_size": 16,
        "num_attention_heads": 4,
        "num_hidden_layers": 3,
        "intermediate_size": 24,
        "add_bias_fnn": True,
        "max_position_embeddings": 130,
    },
}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def vocab_text(k: int) -> str:
    """NT's vocabulary order: specials, every k-mer over A, T, C, G, single bases."""
    kmers = ["".join(p) for p in itertools.product("ATCG", repeat=k)]
    return "\n".join([*SPECIALS, *kmers, "A", "T", "C", "G", "N"])  # no final newline


def json_text(data: dict) -> str:
    return json.dumps(data, indent=2) + "\n"


def check_official(official: Path) -> dict[str, str]:
    hashes = {}
    for name in ("modeling_esm.py", "esm_config.py"):
        digest = sha256((official / name).read_bytes())
        if digest != HUB_SHA256[name]:
            msg = f"{official / name} has sha256 {digest}, not the hub file's {HUB_SHA256[name]}"
            raise SystemExit(msg)
        hashes[name] = digest
    return hashes


def write_tokenizer(folder: Path, k: int) -> None:
    files = {
        "vocab.txt": vocab_text(k),
        "tokenizer_config.json": json_text(TOKENIZER_CONFIG),
        "special_tokens_map.json": json_text(SPECIAL_TOKENS_MAP),
    }
    for name, text in files.items():
        (folder / name).write_text(text)
        if k == 6 and sha256(text.encode()) != HUB_SHA256[name]:
            msg = f"generated {name} does not hash to the hub file's sha256"
            raise SystemExit(msg)


def published_format(template: dict, values: dict) -> dict:
    """The published config's fields in its order, with the tiny model's values."""
    out = dict(template)
    for key, value in values.items():
        if key not in out:
            msg = f"{key} is not a field of the published config"
            raise SystemExit(msg)
        out[key] = value
    return out


def padded_batch(tokenizer, special_ids, seqs: list[str]) -> tuple:  # noqa: ANN001
    """The official tokenizer's padded batch of ``seqs``; special tokens found by id."""
    import torch

    batch = tokenizer(seqs, return_tensors="pt", padding=True)
    return batch, torch.isin(batch["input_ids"], special_ids)


def pooled(model, tokenizer, seq: str, special_ids) -> dict:  # noqa: ANN001
    """The official model's pooled vectors of one sequence (no padding involved)."""
    import torch

    enc = tokenizer(seq, return_tensors="pt")
    keep = ~torch.isin(enc["input_ids"][0], special_ids)
    with torch.no_grad():
        states = model(**enc, output_hidden_states=True).hidden_states
    return pooled_views(states, keep)


def published_counts(official: Path, scratch: Path) -> dict[str, dict[str, int]]:
    """Parameter counts of the official model built from each published config: all
    of ``EsmForMaskedLM``, and the encoder tensors embedcache keeps (``esm.*`` without
    the contact head and the unused absolute position table)."""
    from transformers import AutoConfig, AutoModelForMaskedLM

    out = {}
    for path in sorted(PUBLISHED.parent.glob("*.config.json")):
        folder = scratch / ("published_" + path.name.split(".")[0].replace("-", "_"))
        folder.mkdir()
        shutil.copy(path, folder / "config.json")
        for f in ("modeling_esm.py", "esm_config.py"):
            shutil.copy(official / f, folder / f)
        config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
        model = AutoModelForMaskedLM.from_config(config, trust_remote_code=True)
        kept = sum(
            p.numel()
            for n, p in model.named_parameters()
            if n.startswith("esm.")
            and not n.startswith(
                ("esm.contact_head.", "esm.embeddings.position_embeddings.")
            )
        )
        total = sum(p.numel() for p in model.parameters())
        out[path.name] = {"total": total, "encoder_kept": kept}
        print(path.name, out[path.name])
    return out


def main() -> int:
    args = parse_fixture_args(__doc__, "--official")
    official_hashes = check_official(args.official)

    import numpy as np
    import torch
    from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer

    template = json.loads(PUBLISHED.read_text())
    sequences = fixture_sequences()
    upper = [s.upper() for s in sequences]
    args.out.mkdir(parents=True, exist_ok=True)
    expected: dict[str, np.ndarray] = {}
    tokens: dict[str, list[list[int]]] = {}
    scratch = Path(tempfile.mkdtemp(prefix="ntv2gena-ntref-"))
    for seed, (name, spec) in enumerate(VARIANTS.items()):
        values = {key: v for key, v in spec.items() if key != "k"}
        values["vocab_size"] = len(vocab_text(spec["k"]).split())
        config_dict = published_format(template, values)

        # 1. a random EsmForMaskedLM built by the official code, every weight moved
        build = scratch / f"{name}-build"
        build.mkdir()
        (build / "config.json").write_text(json_text(config_dict))
        for f in ("modeling_esm.py", "esm_config.py"):
            shutil.copy(args.official / f, build / f)
        config = AutoConfig.from_pretrained(build, trust_remote_code=True)
        torch.manual_seed(seed)
        model = AutoModelForMaskedLM.from_config(config, trust_remote_code=True)
        perturb(model, lambda n: 0.3 if "LayerNorm" in n or "layer_norm" in n else 0.2)

        # 2. the hub layout: weights, the published config's fields, tokenizer files
        out_dir = args.out / name
        save_hub_layout(model, out_dir, config_dict, safe=True)
        write_tokenizer(out_dir, spec["k"])

        # 3. the official path, as a user runs it: remote code beside the files
        run = scratch / f"{name}-run"
        shutil.copytree(out_dir, run)
        for f in ("modeling_esm.py", "esm_config.py"):
            shutil.copy(args.official / f, run / f)
        loaded = AutoModelForMaskedLM.from_pretrained(
            run, trust_remote_code=True
        ).eval()
        tokenizer = AutoTokenizer.from_pretrained(run, trust_remote_code=True)
        assert type(loaded).__module__.endswith("modeling_esm"), type(loaded).__module__

        # EsmTokenizer's special_tokens_mask assumes an <eos> that NT-v2 does not add
        # (one flag too many), so special tokens are found by id
        special_ids = torch.tensor(sorted(tokenizer.all_special_ids))

        # the official code with padding gives the same vectors (a check of the
        # reference itself: masked positions must not leak into real ones)
        record_official_vectors(
            name,
            loaded,
            tokenizer,
            upper,
            pool=functools.partial(pooled, loaded, tokenizer, special_ids=special_ids),
            padded_batch=functools.partial(padded_batch, tokenizer, special_ids),
            expected=expected,
            tokens=tokens,
        )
        print(
            f"{name} -> {out_dir}: hidden {config.hidden_size}, vocab {config.vocab_size}"
        )

    meta = {
        "official_code": "hub files modeling_esm.py + esm_config.py of "
        "InstaDeepAI/nucleotide-transformer-v2-50m-multi-species",
        "hub_revision": HUB_REVISION,
        "official_sha256": official_hashes,
        "public_copy": "SeedLLM/molly@62330f73df2a97af53bc176ebc2b3ff76558542f "
        "src/model/{esm_config.py,modeling_esm.py}; modeling_esm.py's "
        "find_pruneable_heads_and_indices/prune_linear_layer import moved to "
        "transformers.pytorch_utils as in the hub revision (then sha256 matches)",
        "hash_source": "kurtvalcorza/nucleotide-transformer-genomics-pipeline "
        "weights/nt-v2-50m-multi-species/dimer-base-manifest.json",
        **library_versions(),
        "loaded_with": "AutoModelForMaskedLM.from_pretrained(dir, trust_remote_code=True)",
        "tokenizer": "AutoTokenizer (EsmTokenizer) on the upper-cased sequence",
        "pooling": pooling_note(
            "hidden_states[-1] (after emb_layer_norm_after), special tokens (<cls>) excluded"
        ),
        "average": AVERAGE_UPPER,
    }
    meta["published_param_counts"] = published_counts(args.official, scratch)
    write_fixtures(
        args.out, expected=expected, sequences=sequences, meta=meta, tokens=tokens
    )
    shutil.rmtree(scratch)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
