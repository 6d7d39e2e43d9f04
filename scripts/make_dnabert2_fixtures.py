"""Build the DNABERT-2 / DNABERT-S equality fixtures in tests/fixtures/dnabert2/ with the official code.

The official code is the hub's remote code (``bert_layers.py``, ``bert_padding.py``,
``configuration_bert.py``), read from public git copies and checked by sha256 before it
runs; nothing official is committed except data files the Apache-2.0 licence lets us
redistribute (the published ``tokenizer.json``/``tokenizer_config.json`` and the
published ``config.json`` files, for the recognition tests).

- DNABERT-2-117M: the hub repository's own history, kept verbatim in a public clone
  (ashal-ali/CS224N_DNABERT2 holds hub commit d064dece8a8b41d9fb8729fbe3435278786931f1,
  "Update README.md", 2024-03-18; git's commit hash pins every file of that tree). The
  code files equal those of hub revision 7bce263b15377fc15361f52cfab88f8b586abda0 by the
  sha256 values a public project records for that revision (checked below).
- DNABERT-S: the authors' repository MAGICS-LAB/DNABERT_S, ``evaluate/model_codes``
  (the files its README says to copy beside DNABERT-S weights). Its ``config.json`` is
  byte-identical to the hub's DNABERT-S config.json at revision
  00e47f96cdea35e4b6f5df89e5419cbe47d490c6 (1,025 bytes, sha256 recorded publicly); its
  ``bert_layers.py`` is DNABERT-2's hub file of 2024-01-12 (git blob 911b79e5).

Run it in a scratch environment OUTSIDE the repository, with Triton absent (so the
official PyTorch attention runs) and transformers 4.29 (the version the DNABERT-2 authors
name; later versions break its config class)::

    python3 -m venv /tmp/dnabert2-ref/venv
    /tmp/dnabert2-ref/venv/bin/pip install torch==2.13.0 transformers==4.29.2 einops
    # git directories (bare mirrors work) of the two public copies:
    /tmp/dnabert2-ref/venv/bin/python scripts/make_dnabert2_fixtures.py \\
        --dnabert2-git <ashal-ali/CS224N_DNABERT2> --dnaberts-git <MAGICS-LAB/DNABERT_S> \\
        --out tests/fixtures/dnabert2

What it writes:

- ``dnabert2/``: a tiny DNABERT-2 in the hub's layout: the published config.json with
  small sizes (6 heads: not a power of 2, so the ALiBi slope rule's second branch runs;
  ``alibi_starting_size`` 16, so the official code rebuilds its ALiBi table), the
  published tokenizer.json and tokenizer_config.json (the real 4,096-token BPE), and
  ``pytorch_model.bin`` saved by the official ``BertForMaskedLM`` (``bert.*`` + ``cls.*``);
- ``dnabert_s/``: a tiny DNABERT-S in its layout: the published DNABERT-S config.json
  with small sizes (4 heads), weights saved by the official ``BertModel`` (no prefix,
  with the pooler), and a 96-token BPE cut from the real vocabulary (the first 96
  tokens and the merges among them) so the fixture stays small;
- ``expected.npz``: per model, the official mean over each sequence's own tokens
  ([CLS]/[SEP] excluded) of every layer (0 = embedding output ... n = last block) and the
  reverse-complement average of the last layer, each sequence run alone (batch 1);
- ``expected.json``: the official token ids of every sequence, the ALiBi slopes the
  official code builds for 1..32 heads, and the largest difference between the official
  padded-batch and one-by-one outputs;
- ``published/``: the published config.json files, for recognition tests;
- ``sequences.txt``, ``meta.json``, ``LICENSE`` (Apache-2.0, of the hub repository).

Every weight is moved off its initial value first, so no structure (ones, zeros, ties)
can hide a mapping bug. Sequences are upper-cased before the official tokenizer, as
embedcache does (the official tokenizer maps lower case to [UNK]).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fixture_writer import (
    library_versions,
    lower_second_half,
    perturb,
    random_bases,
    reverse_complement,
    save_hub_layout,
    write_fixtures,
)

DNABERT2_COMMIT = "d064dece8a8b41d9fb8729fbe3435278786931f1"
DNABERT2_OLD_COMMIT = "25abaf0bd247444fcfa837109f12088114898d98"
DNABERTS_PATH = "evaluate/model_codes"
# sha256 of the hub files (DNABERT-2 at 7bce263b, recorded by a public project; the same
# files are in d064dece); DNABERT-S config.json at 00e47f96
HUB_SHA256 = {
    "bert_layers.py": "317ad7e9667980ac724c07f0174ba265c8446ca5230f6b473068ff1b911edcf9",
    "bert_padding.py": "44d1c68afb1f585fdc66c150d4c60f1ed44a89c006abc57d50531d71940d7421",
    "configuration_bert.py": "95fc868641b87bbcd7a32d2cd7b9f4769c27592e129daf167d14b5b8c74ec4c5",
    "flash_attn_triton.py": "568d1ac3beca0b5e1df528a1f136aa19b6489a616fcf3784f33336a50bb1de81",
    "config.json": "ba9bdafaff0cc3e30556927474d4a179519a9864012bed2628e9f1bc23c84bfd",
    "tokenizer.json": "5d178e8ce2ba55df97fff197f4b30f40133b95d7096be398c2df6b526c5d8cd3",
    "tokenizer_config.json": "f9d18c81f4dd9dd7db02e9f27cc1203228147d890bfce9167c3af6465ff5b769",
}
DNABERTS_CONFIG_SHA256 = (
    "d54c142114563aa34ef7c2b54ccc921d08e50cd7c3cd69c439d5e0d2bbcfcdee"
)
# flash_attn_triton.py must be present (transformers copies every relative import),
# but without Triton its import fails and the official code falls back to PyTorch
CODE_FILES = (
    "bert_layers.py",
    "bert_padding.py",
    "configuration_bert.py",
    "flash_attn_triton.py",
)

# lengths 1 .. 300, lower case, N, lengths that are not multiples of 6, a duplicate
# (rows 6 and 7) and an exact reverse-complement pair (rows 8 and 9)
SEQUENCES = [
    "A",
    "GT",
    "ACGTN",
    "acgta",
    "NNNNNNN",
    "ACGTACGTAC",
    "TTGCAnnGCATG",
    "TTGCAnnGCATG",
    "GATTACAGATTACAGGGCCCTTA",
    "TAAGGGCCCTGTAATCTGTAATC",
    "ccgGGAATTCCNNacgtTTGACAGGCTaa",
]


def _long_sequences() -> list[str]:
    """Longer sequences (37 .. 300 bp) with N runs and soft-masked stretches."""
    rng = random.Random(20261010)
    out = []
    for n in (37, 61, 83, 97, 128, 150, 199, 233, 251, 277, 289, 300, 300):
        text = random_bases(rng, n)
        out.append(lower_second_half(text) if n % 3 else text)
    return out


def _tiny_sizes(
    hidden_size: int, num_attention_heads: int, intermediate_size: int, **extra: int
) -> dict[str, int]:
    """The config sizes of a tiny variant: 2 layers, an ALiBi table of 16 positions."""
    return {
        "hidden_size": hidden_size,
        "num_attention_heads": num_attention_heads,
        "num_hidden_layers": 2,
        "intermediate_size": intermediate_size,
        "alibi_starting_size": 16,
        **extra,
    }


def _git_show(repo: Path, rev: str, path: str) -> bytes:
    return subprocess.run(
        ["git", "-C", str(repo), "show", f"{rev}:{path}"],
        check=True,
        capture_output=True,
    ).stdout


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _small_bpe(tokenizer_json: dict, n_vocab: int) -> dict:
    """The real BPE cut to its first ``n_vocab`` tokens and the merges among them."""
    small = json.loads(json.dumps(tokenizer_json))
    vocab = {t: i for t, i in small["model"]["vocab"].items() if i < n_vocab}
    merges = []
    for merge in small["model"]["merges"]:
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        if left in vocab and right in vocab and left + right in vocab:
            merges.append(merge)
    small["model"]["vocab"] = vocab
    small["model"]["merges"] = merges
    return small


def _official_pooled(official: object, tokenizer: object, seq: str) -> tuple:
    """The official model's per-layer means over ``seq``'s own tokens (batch 1)."""
    import torch

    enc = tokenizer(seq, return_tensors="pt", return_special_tokens_mask=True)
    ids = enc["input_ids"]
    special = enc["special_tokens_mask"][0].bool()
    if not (special[0] and special[-1]) or special[1:-1].any():
        sys.exit(f"{seq}: the official tokenizer did not give [CLS] ... [SEP]")
    keep = ~special
    with torch.no_grad():
        emb = official.embeddings(ids, torch.zeros_like(ids), None)
        # the encoder's list is unpadded (tokens, d): batch 1 has no padding
        blocks = official.encoder(
            emb, enc["attention_mask"], output_all_encoded_layers=True
        )
        final = official(ids)[0][0]  # the README's call
    if not torch.equal(final, blocks[-1]):
        sys.exit("the README call and the encoder's last layer disagree")
    states = [emb[0], *blocks]
    return [s[keep].mean(dim=0) for s in states], ids[0].tolist(), final[keep].mean(0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dnabert2-git", type=Path, required=True)
    parser.add_argument("--dnaberts-git", type=Path, required=True)
    parser.add_argument("--dnaberts-rev", default="HEAD")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    import os

    scratch = Path(tempfile.mkdtemp(prefix="dnabert2-ref-"))
    os.environ["HF_HOME"] = str(scratch / "hf-home")  # remote-code module cache
    os.environ["HF_HUB_OFFLINE"] = "1"

    import numpy as np
    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    try:
        import triton  # noqa: F401
    except ImportError:
        pass
    else:
        sys.exit(
            "Triton is installed: the official code would not run its PyTorch path"
        )

    dnaberts_rev = subprocess.run(
        ["git", "-C", str(args.dnaberts_git), "rev-parse", args.dnaberts_rev],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    hub = {
        name: _git_show(args.dnabert2_git, DNABERT2_COMMIT, name)
        for name in (
            *CODE_FILES,
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
        )
    }
    for name, data in hub.items():
        if _sha(data) != HUB_SHA256[name]:
            sys.exit(
                f"{name} at {DNABERT2_COMMIT} is not the hub file (sha256 differs)"
            )
    old_config = _git_show(args.dnabert2_git, DNABERT2_OLD_COMMIT, "config.json")
    licence = _git_show(args.dnabert2_git, DNABERT2_COMMIT, "LICENSE")
    dnaberts = {
        name: _git_show(args.dnaberts_git, dnaberts_rev, f"{DNABERTS_PATH}/{name}")
        for name in (*CODE_FILES, "config.json")
    }
    if _sha(dnaberts["config.json"]) != DNABERTS_CONFIG_SHA256:
        sys.exit("DNABERT-S config.json is not the hub file (sha256 differs)")

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "published").mkdir(exist_ok=True)
    (out / "published" / "dnabert2_117m_config.json").write_bytes(hub["config.json"])
    (out / "published" / "dnabert2_117m_config_2024-01.json").write_bytes(old_config)
    (out / "published" / "dnabert_s_config.json").write_bytes(dnaberts["config.json"])
    (out / "LICENSE").write_bytes(licence)

    tokenizer_json = json.loads(hub["tokenizer.json"])
    models = {
        "dnabert2": {
            "code": {n: hub[n] for n in CODE_FILES},
            "config": json.loads(hub["config.json"]),
            "sizes": _tiny_sizes(12, 6, 20),
            "class": "bert_layers.BertForMaskedLM",
            "tokenizer": hub["tokenizer.json"],
        },
        "dnabert_s": {
            "code": {n: dnaberts[n] for n in CODE_FILES},
            "config": json.loads(dnaberts["config.json"]),
            "sizes": _tiny_sizes(16, 4, 24, vocab_size=96),
            "class": "bert_layers.BertModel",
            "tokenizer": (
                json.dumps(_small_bpe(tokenizer_json, 96), indent=2) + "\n"
            ).encode(),
        },
    }
    sequences = SEQUENCES + _long_sequences()
    upper = [s.upper() for s in sequences]
    expected: dict[str, np.ndarray] = {}
    tokens: dict[str, list[list[int]]] = {}
    batch_gap: dict[str, float] = {}
    for seed, (name, spec) in enumerate(models.items()):
        config = {**spec["config"], **spec["sizes"]}
        build = scratch / f"{name}-build"
        build.mkdir()
        for fname, data in spec["code"].items():
            (build / fname).write_bytes(data)
        (build / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        cfg = AutoConfig.from_pretrained(build, trust_remote_code=True)
        cls = get_class_from_dynamic_module(spec["class"], str(build))
        torch.manual_seed(seed)
        model = cls(cfg)
        perturb(model, lambda _: 0.1)
        target = out / name
        # the published layout: its config.json fields, not the class's to_dict()
        save_hub_layout(model, target, config, safe=False)
        (target / "tokenizer.json").write_bytes(spec["tokenizer"])
        (target / "tokenizer_config.json").write_bytes(hub["tokenizer_config.json"])

        # the official path, as its README runs it: AutoModel with the code beside it
        run = scratch / f"{name}-run"
        shutil.copytree(target, run)
        for fname, data in spec["code"].items():
            (run / fname).write_bytes(data)
        official = AutoModel.from_pretrained(run, trust_remote_code=True).eval()
        tokenizer = AutoTokenizer.from_pretrained(run)
        n_layers = cfg.num_hidden_layers
        rows: dict[int, list] = {layer: [] for layer in range(n_layers + 1)}
        last_rows, rc_rows, ids_list = [], [], []

        for seq in upper:
            layers, ids, last = _official_pooled(official, tokenizer, seq)
            rc = reverse_complement(seq)
            _, _, rc_last = _official_pooled(official, tokenizer, rc)
            for layer, vec in enumerate(layers):
                rows[layer].append(vec.numpy())
            last_rows.append(last.numpy())
            rc_rows.append(((last + rc_last) / 2).numpy())
            ids_list.append(ids)
        for layer, vecs in rows.items():
            expected[f"{name}_layer{layer}"] = np.stack(vecs).astype(np.float32)
        expected[f"{name}_last"] = np.stack(last_rows).astype(np.float32)
        expected[f"{name}_rc_average"] = np.stack(rc_rows).astype(np.float32)
        tokens[name] = ids_list

        # the official padded batch against one-by-one (its -10000 mask is not exact)
        enc = tokenizer(
            upper, return_tensors="pt", padding=True, return_special_tokens_mask=True
        )
        with torch.no_grad():
            hidden = official(enc["input_ids"], attention_mask=enc["attention_mask"])[0]
        keep = (
            enc["attention_mask"].bool() & ~enc["special_tokens_mask"].bool()
        ).float()
        batched = (hidden * keep[..., None]).sum(1) / keep.sum(1, keepdim=True)
        batch_gap[name] = float(
            (batched - torch.tensor(expected[f"{name}_last"])).abs().max()
        )
        print(name, "->", target, f"batched vs alone {batch_gap[name]:.2e}")

    slopes = {}
    encoder_cls = get_class_from_dynamic_module(
        "bert_layers.BertEncoder", str(scratch / "dnabert2-build")
    )
    for n_heads in range(1, 33):
        cfg = AutoConfig.from_pretrained(
            scratch / "dnabert2-build", trust_remote_code=True
        )
        cfg.update(
            {
                "hidden_size": n_heads,
                "num_attention_heads": n_heads,
                "num_hidden_layers": 1,
                "intermediate_size": 2,
                "alibi_starting_size": 2,
            }
        )
        encoder = encoder_cls(cfg)
        slopes[str(n_heads)] = (-encoder.alibi[0, :, 0, 1]).tolist()

    (out / "expected.json").write_text(
        json.dumps(
            {
                "tokens": tokens,
                "alibi_slopes": slopes,
                "official_batched_vs_alone": batch_gap,
            },
            indent=1,
        )
        + "\n"
    )
    meta = {
        "dnabert2_117m": {
            "copy": "github ashal-ali/CS224N_DNABERT2 (a clone of the hub repository)",
            "hub_commit": DNABERT2_COMMIT,
            "files_sha256": {n: _sha(hub[n]) for n in hub},
            "same_code_as_hub_revision": "7bce263b15377fc15361f52cfab88f8b586abda0",
            "old_config_commit": DNABERT2_OLD_COMMIT,
        },
        "dnabert_s": {
            "copy": f"github MAGICS-LAB/DNABERT_S @ {dnaberts_rev}, {DNABERTS_PATH}",
            "files_sha256": {n: _sha(dnaberts[n]) for n in dnaberts},
            "config_equals_hub_revision": "00e47f96cdea35e4b6f5df89e5419cbe47d490c6",
        },
        **library_versions(),
        "triton": "absent (official PyTorch attention path)",
        "pooling": "mean over the sequence's own tokens ([CLS]/[SEP] excluded), batch 1",
        "layers": "layer 0 = embedding output, i = output of block i (unpadded encoder list)",
        "rc_average": "(pooled(seq) + pooled(revcomp(seq))) / 2 of the last layer",
        "perturbation": "every parameter += 0.1 * N(0, 1) after the official init",
    }
    write_fixtures(out, expected=expected, sequences=sequences, meta=meta)
    shutil.rmtree(scratch)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
