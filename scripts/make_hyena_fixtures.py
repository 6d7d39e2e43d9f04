"""Build the HyenaDNA equality fixtures in tests/fixtures/hyena/ with the official hub code.

The official code is the remote code of the ``LongSafari/hyenadna-*-seqlen-hf``
repositories: ``modeling_hyena.py``, ``configuration_hyena.py`` and
``tokenization_hyena.py``. Put the three files in one directory outside this
repository and pass it as ``--hub-code``; the script checks each file's sha256 against
the hub's (as recorded publicly, see ``HUB_SHA256``) and writes what matched to
``meta.json``. Nothing official is committed: only tiny random models in the
published layout and the vectors the official code computed.

Run it in a scratch environment OUTSIDE the repository (the official tokenizer needs
transformers < 4.40)::

    python3 -m venv /tmp/hyena-venv
    /tmp/hyena-venv/bin/pip install torch==2.13.0 transformers==4.35.2 'numpy<2' safetensors
    /tmp/hyena-venv/bin/python scripts/make_hyena_fixtures.py \\
        --hub-code /tmp/hyena-ref/hub-exact --out tests/fixtures/hyena

What it writes, per model (``tiny``: the published configs' options at a small
width; ``alt``: the options the published configs do not use, so both code paths are
covered): ``<name>/config.json`` + ``<name>/model.safetensors`` (``save_pretrained``
of a ``HyenaDNAForCausalLM`` whose every parameter and stored buffer, ``z``, ``t``
and ``deltas`` included, was moved off its initial value) + the tokenizer files, and
in ``expected.npz`` the pooled hidden states of each sequence of ``sequences.txt``.

Each sequence is upper-cased (as embedcache does; the official tokenizer does not
upper-case, it maps lower case to [UNK]) and tokenised by the official tokenizer with
its defaults (it appends [SEP]); each sequence runs alone, so no padding enters the
model. Pooled vectors: ``mean`` over the sequence's bases ([SEP] excluded),
``mean_include`` ([SEP] included), ``last`` (the last base), ``last_include`` (the
[SEP] position), for the final output (after ``ln_f``), the embedding output (layer
0) and block 1's output (layer 1); ``average`` is the mean of the pooled vectors of
the sequence and of its reverse complement.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fixture_writer import (
    CORNER_SEQUENCES,
    library_versions,
    parse_fixture_args,
    reverse_complement,
    soft_masked,
    write_fixtures,
)

# sha256 of the hub files as tcztzy/evo.cpp records them for
# LongSafari/hyenadna-medium-160k-seqlen-hf@7ebf71773d22c0ede2cc55cb2be15ee8c289e1ce
# and LongSafari/hyenadna-large-1m-seqlen-hf@0a629abf9c7f85b4ec9aa6a1aefa3adcf1907446
# (tools/generate_geneb_hyenadna_upstream_oracle.py at commit c281681e27ea)
HUB_SHA256 = {
    "modeling_hyena.py": (
        22584,
        "d78029cacea2c9259f1293fdb50b60f90872089469185e27d5c769086c475607",
    ),
    "configuration_hyena.py": (
        3093,
        "29cb6cae67f5010e279d67349e688663043f0bd6791a09c36d96da8cac3668a6",
    ),
    "tokenization_hyena.py": (
        4057,
        "d424da2f794958b0360e033bbf5edc9ee4e3e3126e883093621348f07761e408",
    ),
}
# where the copies used for tests/fixtures/hyena came from (no hub access here)
COPIES = {
    "modeling_hyena.py": (
        "shubhamtkr/checkpoint-62500@22f96459d32d1b300fc75b225c53495e7a96ec2b:"
        "modeling_hyena.py (22,533 bytes) with its line 2 restored to the hub's module "
        'docstring """HyenaDNA custom code port to Hugging Face Hub""" (the only '
        "difference, as another public copy shows); the result has the hub's sha256"
    ),
    "configuration_hyena.py": (
        "shubhamtkr/checkpoint-62500@22f96459d32d1b300fc75b225c53495e7a96ec2b:"
        "configuration_hyena.py, byte-identical to the hub's"
    ),
    "tokenization_hyena.py": (
        "no byte-identical public copy was found: HyenaDNATokenizer re-typed from a "
        "public adaptation of the hub file (the class body, registry decorator "
        "dropped) with the two typing/transformers imports; its ids, [SEP]-only "
        "suffix, special-token mask and left padding agree with the hub's recorded "
        "tokenizer semantics (evo.cpp configs/tokenizers/"
        "geneb-hyenadna-character-source-v1.json)"
    ),
}
AUTO_MAP = {
    "AutoConfig": "configuration_hyena.HyenaConfig",
    "AutoModel": "modeling_hyena.HyenaDNAModel",
    "AutoModelForCausalLM": "modeling_hyena.HyenaDNAForCausalLM",
    "AutoModelForSequenceClassification": (
        "modeling_hyena.HyenaDNAForSequenceClassification"
    ),
}
MAX_SEQ_LEN = 330  # room for the 300 bp sequence and its [SEP]

VARIANTS = {
    # the published configs' options (emb_dim 5, 2 inner MLPs, trained Sin
    # frequency 10, eps 1e-5, vocabulary padded to 16 rows) at a small width
    "tiny": {
        "d_model": 32,
        "n_layer": 2,
        "d_inner": 64,
        "filter_order": 16,
        "emb_dim": 5,
        "num_inner_mlps": 2,
        "activation_freq": 10,
        "train_freq": True,
        "layer_norm_epsilon": 1e-5,
        "pad_vocab_size_multiple": 8,
    },
    # the options the published configs leave at other values
    "alt": {
        "d_model": 24,
        "n_layer": 3,
        "d_inner": None,  # 4 x d_model
        "filter_order": 8,
        "emb_dim": 3,
        "num_inner_mlps": 1,
        "activation_freq": 3,
        "train_freq": False,  # a constant frequency, not in the checkpoint
        "layer_norm_epsilon": 1e-6,
        "pad_vocab_size_multiple": 5,
    },
}

SEQUENCES = [
    *CORNER_SEQUENCES,
    "ACGCGTTAGCATGCAANCGATCGATGCATG",  # a duplicate
    "AACCGGTTTAGC",
    "GCTAAACCGGTT",  # the reverse complement of the one before
    "TTTTTTTTTTTTT",
    "CAGT" * 11 + "C",
    # longer sequences with N runs and soft masking
    *soft_masked((7, 97, 150, 251, 299, 300)),
]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _check_hub_code(folder: Path) -> dict[str, dict[str, object]]:
    report = {}
    for name, (size, digest) in HUB_SHA256.items():
        path = folder / name
        if not path.is_file():
            msg = f"{path} is missing; --hub-code must hold the three hub files"
            raise SystemExit(msg)
        got = _sha256(path)
        report[name] = {
            "size": path.stat().st_size,
            "sha256": got,
            "hub_size": size,
            "hub_sha256": digest,
            "byte_identical_to_hub": got == digest,
        }
        print(
            f"{name}: {'matches the hub' if got == digest else 'DIFFERS from the hub'}"
        )
    return report


def _import_hub_code(folder: Path) -> tuple[object, object, object]:
    """Import the three files as one package (modeling_hyena imports relatively)."""
    root = Path(tempfile.mkdtemp(prefix="hyena-hub-"))
    package = root / "hyena_hub"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in HUB_SHA256:
        shutil.copy(folder / name, package / name)
    sys.path[:0] = [str(root)]
    configuration = importlib.import_module("hyena_hub.configuration_hyena")
    modeling = importlib.import_module("hyena_hub.modeling_hyena")
    tokenization = importlib.import_module("hyena_hub.tokenization_hyena")
    return configuration, modeling, tokenization


def _pooled(model: object, tokenizer: object, seq: str) -> dict[str, object]:
    """The pooled vectors of one sequence, run alone through the official model."""
    import torch

    enc = tokenizer(seq, return_special_tokens_mask=True)
    ids = torch.tensor([enc["input_ids"]])
    keep = ~torch.tensor(enc["special_tokens_mask"], dtype=torch.bool)
    with torch.no_grad():
        out = model.hyena(ids, output_hidden_states=True, return_dict=True)
    hidden = out.hidden_states  # embeddings, each block, the ln_f output
    final = out.last_hidden_state[0]
    last_base = int(keep.nonzero().max())
    return {
        "mean": final[keep].mean(0).numpy(),
        "mean_include": final.mean(0).numpy(),
        "last": final[last_base].numpy(),
        "last_include": final[-1].numpy(),
        "layer0_mean": hidden[0][0][keep].mean(0).numpy(),
        "layer1_mean": hidden[1][0][keep].mean(0).numpy(),
    }


def main() -> int:
    args = parse_fixture_args(__doc__, "--hub-code")

    hub_files = _check_hub_code(args.hub_code)
    configuration, modeling, tokenization = _import_hub_code(args.hub_code)

    import numpy as np
    import torch
    from safetensors.torch import load_file

    sequences = SEQUENCES
    upper = [s.upper() for s in sequences]
    tokenizer = tokenization.HyenaDNATokenizer(model_max_length=MAX_SEQ_LEN)
    defaults = tokenizer("ACGTN", return_special_tokens_mask=True)
    token_ids = {s: tokenizer(s)["input_ids"] for s in sorted(set(upper))}

    args.out.mkdir(parents=True, exist_ok=True)
    expected: dict[str, np.ndarray] = {}
    padding_defect: dict[str, float] = {}
    for seed, (name, options) in enumerate(VARIANTS.items()):
        torch.manual_seed(100 + seed)
        config = configuration.HyenaConfig(
            vocab_size=12,
            max_seq_len=MAX_SEQ_LEN,
            hyena_order=2,
            short_filter_order=3,
            use_bias=True,
            embed_dropout=0.1,
            pad_token_id=4,
            tie_word_embeddings=False,
            architectures=["HyenaDNAForCausalLM"],
            auto_map=AUTO_MAP,
            **options,
        )
        model = modeling.HyenaDNAForCausalLM(config).eval()
        with torch.no_grad():
            # move every parameter and stored buffer off its init, so no structure
            # (ones, zeros, the recomputable z and t, the linspace deltas) hides a bug
            for pname, p in model.named_parameters():
                if pname.endswith(".freq"):
                    p.add_(torch.randn_like(p))
                elif "norm" in pname or "ln_f" in pname:
                    p.add_(torch.randn_like(p) * 0.3)
                else:
                    p.add_(torch.randn_like(p) * 0.1)
            for bname, b in model.named_buffers():
                if bname.endswith("pos_emb.z"):
                    b.add_(torch.randn_like(b) * 0.1)
                elif bname.endswith("pos_emb.t"):
                    b.add_(torch.rand_like(b) * 0.05)
                elif bname.endswith("deltas"):
                    b.add_(torch.randn_like(b) * 0.3)
        out_dir = args.out / name
        model.save_pretrained(out_dir, safe_serialization=True)
        tokenizer.save_pretrained(out_dir)
        # the hub's tokenizer_config.json names its class and code
        tok_config_path = out_dir / "tokenizer_config.json"
        tok_config = json.loads(tok_config_path.read_text())
        tok_config["tokenizer_class"] = "HyenaDNATokenizer"
        tok_config["auto_map"] = {
            "AutoTokenizer": ["tokenization_hyena.HyenaDNATokenizer", None]
        }
        tok_config_path.write_text(json.dumps(tok_config, indent=2) + "\n")

        loaded = modeling.HyenaDNAForCausalLM.from_pretrained(out_dir).eval()
        rows: dict[str, list[np.ndarray]] = {}

        for seq in upper:
            forward = _pooled(loaded, tokenizer, seq)
            reverse = _pooled(loaded, tokenizer, reverse_complement(seq))
            for what, vector in forward.items():
                rows.setdefault(f"{name}_{what}_none", []).append(vector)
            rows.setdefault(f"{name}_mean_average", []).append(
                (forward["mean"] + reverse["mean"]) / 2
            )
        for key, vectors in rows.items():
            expected[key] = np.stack(vectors).astype(np.float32)

        # the official batch: left padding and no attention mask
        batch = tokenizer(
            upper,
            padding=True,
            return_attention_mask=True,
            return_special_tokens_mask=True,
        )
        ids = torch.tensor(batch["input_ids"])
        keep = (
            torch.tensor(batch["attention_mask"]).bool()
            & ~torch.tensor(batch["special_tokens_mask"]).bool()
        )
        with torch.no_grad():
            final = loaded.hyena(ids, return_dict=True).last_hidden_state
        left = torch.stack(
            [final[i][keep[i]].mean(0) for i in range(len(upper))]
        ).numpy()
        padding_defect[name] = float(np.abs(left - expected[f"{name}_mean_none"]).max())
        stored = load_file(out_dir / "model.safetensors")
        print(name, "->", out_dir, f"({len(stored)} tensors)")

    meta = {
        "official_code": (
            "the hub's remote code of LongSafari/hyenadna-*-seqlen-hf: "
            "modeling_hyena.py, configuration_hyena.py, tokenization_hyena.py"
        ),
        "hub_files": hub_files,
        "copies": COPIES,
        **library_versions(),
        "tokenizer_defaults": {
            "ACGTN input_ids": defaults["input_ids"],
            "ACGTN special_tokens_mask": defaults["special_tokens_mask"],
            "padding_side": tokenizer.padding_side,
            "lower case acgt": tokenizer("acgt")["input_ids"],
        },
        "pooling": (
            "mean over the upper-cased sequence's tokens of the ln_f output, each "
            "sequence alone, official tokenizer defaults ([SEP] appended; excluded "
            "from 'mean' and 'last', included in '*_include')"
        ),
        "average": "(pooled(seq) + pooled(rc(seq))) / 2",
        "official_left_padded_batch_max_abs_diff": padding_defect,
    }
    write_fixtures(
        args.out,
        expected=expected,
        sequences=sequences,
        meta=meta,
        tokens=token_ids,
        tokens_indent=1,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
