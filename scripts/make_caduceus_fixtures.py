"""Build the Caduceus equality fixtures in tests/fixtures/caduceus/ with the official code.

The official Caduceus code needs ``mamba_ssm`` (CUDA kernels). This script runs it on
CPU by giving it a stand-in ``mamba_ssm`` built, in a temporary directory, from
mamba_ssm 1.2.0.post1's own pure-PyTorch pieces (the version Caduceus pins):
``modules/mamba_simple.py`` verbatim, ``selective_scan_ref`` as ``selective_scan_fn``,
and the triton add+norm functions replaced by their reference semantics (fp32 math,
output in the input dtype, residual in its own dtype or fp32). Nothing official is
committed: only the tiny random models and the vectors the official code computed.

Run it in a scratch environment OUTSIDE the repository (the official code needs
transformers 4.x)::

    python3 -m venv /tmp/cadref-venv
    /tmp/cadref-venv/bin/pip install torch==2.13.0 transformers==4.38.1 einops safetensors
    git clone https://github.com/kuleshov-group/caduceus /tmp/caduceus
    git clone https://github.com/state-spaces/mamba /tmp/mamba
    /tmp/cadref-venv/bin/python scripts/make_caduceus_fixtures.py \\
        --caduceus-git /tmp/caduceus --mamba-git /tmp/mamba --out tests/fixtures/caduceus

Both ``--*-git`` arguments are git directories (a bare mirror works); the revisions
used are written to ``tests/fixtures/caduceus/meta.json``.

What it writes, per model (``ph``, ``ps`` with fused add+norm, ``ps_unfused``):
``<name>/config.json`` + ``<name>/model.safetensors`` (``save_pretrained`` of a
``CaduceusForMaskedLM`` whose every weight was moved off its initial value), and
``expected.npz`` with the mean-pooled final-norm output for each sequence of
``sequences.txt`` in rc modes ``none`` and ``average``.

Sequences are fed to the official tokenizer as written (some hold lower case); it
upper-cases them itself, so the vectors equal those of the upper-cased sequence that
embedcache passes to its adapter. RC for ``ph`` ``average`` is computed in token space
with the tokenizer's complement map, as the official ``rcps`` embedding does.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fixture_writer import (
    CORNER_SEQUENCES,
    library_versions,
    perturb,
    soft_masked,
    write_fixtures,
)

MAMBA_REV = "v1.2.0.post1"
# parameters moved further off their init (their inits are ones or structured)
_PERTURB_MORE = ("A_log", "D", "norm.weight", "norm_f.weight")

# lengths vary (1 .. 300) and repeat, so tests can batch equal lengths; longer
# sequences (150, 150, 300 bp) hold N runs and soft-masked stretches
SEQUENCES = CORNER_SEQUENCES + soft_masked((150, 150, 300))


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


def _extract(text: str, start: str, stop_prefixes: tuple[str, ...]) -> str:
    """Lines from the one starting with ``start`` up to the next top-level stop line."""
    out, on = [], False
    for line in text.splitlines():
        if line.startswith(start):
            on = True
        elif on and line.startswith(stop_prefixes):
            break
        if on:
            out.append(line)
    return "\n".join(out) + "\n"


_ADD_NORM = """
def layer_norm_fn(x, weight, bias, residual=None, eps=1e-6, prenorm=False,
                  residual_in_fp32=False, is_rms_norm=False):
    # the triton kernel's forward: fp32 math, y in x.dtype, residual_out in the
    # residual's dtype (fp32 if residual_in_fp32 and no residual), else x itself
    residual_dtype = residual.dtype if residual is not None else (
        torch.float32 if residual_in_fp32 else None)
    xf = x.float()
    if residual is not None:
        xf = xf + residual.float()
    residual_out = x if (residual is None and residual_dtype is None) else xf.to(residual_dtype)
    w = weight.float()
    b = bias.float() if bias is not None else None
    if is_rms_norm:
        y = xf * (1 / torch.sqrt(xf.square().mean(dim=-1, keepdim=True) + eps)) * w
        y = y + b if b is not None else y
    else:
        y = F.layer_norm(xf, xf.shape[-1:], weight=w, bias=b, eps=eps)
    y = y.to(x.dtype)
    return y if not prenorm else (y, residual_out)


def rms_norm_fn(x, weight, bias, residual=None, prenorm=False, residual_in_fp32=False,
                eps=1e-6):
    return layer_norm_fn(x, weight, bias, residual, eps, prenorm, residual_in_fp32, True)

"""


def build_standin(mamba_git: Path, root: Path) -> None:
    """Write a CPU-only ``mamba_ssm`` package under ``root``."""
    pkg = root / "mamba_ssm"
    for sub in ("", "modules", "ops", "ops/triton"):
        (pkg / sub).mkdir(parents=True, exist_ok=True)
        (pkg / sub / "__init__.py").write_text("")
    show = lambda path: _git(mamba_git, "show", f"{MAMBA_REV}:mamba_ssm/{path}")
    (pkg / "modules/mamba_simple.py").write_text(show("modules/mamba_simple.py"))
    scan = _extract(
        show("ops/selective_scan_interface.py"),
        "def selective_scan_ref",
        ("def ", "class "),
    )
    (pkg / "ops/selective_scan_interface.py").write_text(
        "import torch\nimport torch.nn.functional as F\nfrom einops import rearrange, repeat\n\n"
        + scan
        + "\nselective_scan_fn = selective_scan_ref\nmamba_inner_fn = None\n"
    )
    norm_src = show("ops/triton/layernorm.py")
    rms_cls = _extract(norm_src, "class RMSNorm", ("def ", "class ", "@"))
    (pkg / "ops/triton/layernorm.py").write_text(
        "import torch\nimport torch.nn.functional as F\n" + _ADD_NORM + rms_cls
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--caduceus-git", type=Path, required=True)
    parser.add_argument("--caduceus-rev", default="HEAD")
    parser.add_argument("--mamba-git", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="cadref-"))
    build_standin(args.mamba_git, tmp)
    caduceus_rev = _git(args.caduceus_git, "rev-parse", args.caduceus_rev).strip()
    archive = subprocess.run(
        ["git", "-C", str(args.caduceus_git), "archive", caduceus_rev, "caduceus"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
    sys.path[:0] = [str(tmp)]

    import numpy as np
    import torch
    from caduceus.configuration_caduceus import CaduceusConfig
    from caduceus.modeling_caduceus import CaduceusForMaskedLM
    from caduceus.tokenization_caduceus import CaduceusTokenizer
    from safetensors.torch import load_file

    sequences = SEQUENCES
    tokenizer = CaduceusTokenizer(model_max_length=1024)
    common = {
        "d_model": 40,
        "n_layer": 3,
        "vocab_size": 12,
        "ssm_cfg": {"d_state": 16, "d_conv": 4, "expand": 2},
        "rms_norm": True,
        "pad_vocab_size_multiple": 8,
        "bidirectional": True,
        "bidirectional_strategy": "add",
        "bidirectional_weight_tie": True,
    }
    variants = {
        "ph": {"rcps": False, "fused_add_norm": True, "residual_in_fp32": True},
        "ps": {"rcps": True, "fused_add_norm": True, "residual_in_fp32": False},
        "ps_unfused": {
            "rcps": True,
            "fused_add_norm": False,
            "residual_in_fp32": False,
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    expected: dict[str, np.ndarray] = {}
    comp = torch.tensor(
        [tokenizer.complement_map[i] for i in range(len(tokenizer.complement_map))]
    )
    for seed, (name, extra) in enumerate(variants.items()):
        torch.manual_seed(seed)
        cmap = dict(tokenizer.complement_map) if extra["rcps"] else None
        config = CaduceusConfig(**common, **extra, complement_map=cmap)
        model = CaduceusForMaskedLM(config)
        perturb(model, lambda n: 0.3 if n.endswith(_PERTURB_MORE) else 0.1)
        out_dir = args.out / name
        model.save_pretrained(out_dir, safe_serialization=True)
        loaded = CaduceusForMaskedLM.from_pretrained(out_dir).eval()
        d = config.d_model
        none_rows, avg_rows = [], []
        for seq in sequences:
            ids = torch.tensor([tokenizer(seq, add_special_tokens=False)["input_ids"]])
            with torch.no_grad():
                hidden = loaded.caduceus(ids, return_dict=True).last_hidden_state[0]
                pooled = hidden.mean(dim=0)
                if extra["rcps"]:
                    avg = (pooled[:d] + pooled[d:].flip(0)) / 2
                else:
                    rc_ids = comp[ids.flip(-1)]
                    rc_hidden = loaded.caduceus(
                        rc_ids, return_dict=True
                    ).last_hidden_state[0]
                    avg = (pooled + rc_hidden.mean(dim=0)) / 2
            none_rows.append(pooled.numpy())
            avg_rows.append(avg.numpy())
        expected[f"{name}_none"] = np.stack(none_rows).astype(np.float32)
        expected[f"{name}_average"] = np.stack(avg_rows).astype(np.float32)
        stored = load_file(out_dir / "model.safetensors")
        print(name, "->", out_dir, f"({len(stored)} tensors; tied ones left out)")

    meta = {
        "caduceus_git_revision": caduceus_rev,
        "mamba_ssm_revision": MAMBA_REV,
        "mamba_ssm_revision_sha": _git(args.mamba_git, "rev-parse", MAMBA_REV).strip(),
        **library_versions(),
        "pooling": "mean over tokens of the final-norm output, add_special_tokens=False",
        "ph_average": "(pooled(seq) + pooled(rc(seq))) / 2, rc in token space",
        "ps_average": "(pooled[:d] + pooled[d:][::-1]) / 2",
    }
    write_fixtures(args.out, expected=expected, sequences=sequences, meta=meta)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
