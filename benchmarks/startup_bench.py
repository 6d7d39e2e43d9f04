"""Start-up of the light commands and of a family's imports, best of N, per checkout.

Each command runs in a fresh interpreter (``python -m embedcache.cli ...``) with
``PYTHONPATH`` set to the checkout under test, so two checkouts (say main and a
branch) are timed side by side in one run::

    python benchmarks/startup_bench.py --root /work/main --root . --rounds 3

The issue's limits: ``--help``, ``versions``, ``models`` <= 1.0 s; ``embed --model
kmer-4`` on 10 sequences <= 1.5 s; a transformer family's imports before its weights
load <= 2.5 s. Wall times on a shared machine are noisy: the best round is shown.

``--families`` adds two kinds of line. ``imports:`` imports what a family's load
imports before it reads weights, in this checkout (NT-v2 and a plain BERT no longer
need transformers; an older checkout lacks some of these modules and shows nan).
``load:`` is the same command in every checkout: a fresh interpreter loads a model
and embeds one sequence, so it holds the imports, the tokenizer, the build, the
weights (a 512-wide 8-layer BERT saved by transformers, about 100 MB; the tiny NT-v2
fixture) and one forward pass.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SEQS = [
    "ACGTACGTAAGGCT",
    "ACGTTTGCAGG",
    "GGGCCCATATAC",
    "ACGTGGCA",
    "AAAAACCCGT",
    "ACGTAGGCTA",
    "TTTTGCAGCT",
    "GCGCGCATAT",
    "ATATATCGCG",
    "CCCGGGTATA",
]
# what loads before a family's weights: its adapter, network and tokenizer modules
# (the 512-wide BERT goes through `hf`, which has its own plain BERT)
FAMILY_IMPORTS = {
    "hf (BERT)": "import embedcache.models.families.hf.adapter, "
    "embedcache.models.families.bert.adapter, embedcache.models.families.bert.network, "
    "embedcache.models.shared.meta_init, tokenizers, safetensors.torch",
    "ntv2": "import embedcache.models.families.ntv2.adapter, "
    "embedcache.models.families.ntv2.network, embedcache.models.shared.esm_tokens, "
    "embedcache.models.shared.meta_init, safetensors.torch",
    "hyena": "import embedcache.models.families.hyena.adapter, "
    "embedcache.models.families.hyena.network",
    "caduceus": "import embedcache.models.families.caduceus.adapter, "
    "embedcache.models.families.caduceus.kernels",
}
LOAD = (
    "from embedcache.models import load_adapter; "
    "load_adapter({path!r}, device='cpu').embed_batch(['ACGTACGTAAN'])"
)


def best_wall(cmd: list[str], *, root: Path, cwd: Path, rounds: int) -> float:
    """The fastest of ``rounds`` wall times of ``cmd`` with ``root`` first on the path."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, check=False)
        if done.returncode == 0:  # a failed run (e.g. a crash at exit) is not timed
            times.append(time.perf_counter() - start)
        else:
            print(f"  ({' '.join(cmd[2:])} in {root}: exit {done.returncode})")
    return min(times, default=float("nan"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root", action="append", type=Path, help="checkout to time (repeatable)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--families", action="store_true", help="also time the family imports"
    )
    args = parser.parse_args()
    roots = [r.resolve() for r in args.root or [Path(__file__).resolve().parents[1]]]
    py = [sys.executable]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "in.txt").write_text("\n".join(SEQS) + "\n")
        commands = {
            "--help": [*py, "-m", "embedcache.cli", "--help"],
            "versions": [*py, "-m", "embedcache.cli", "versions"],
            "models": [*py, "-m", "embedcache.cli", "models"],
            "store ls": [*py, "-m", "embedcache.cli", "store", "ls", "--store", "s"],
            "embed kmer-4 (10 seqs)": [
                *py,
                *("-m", "embedcache.cli", "embed", "--model", "kmer-4"),
                *("--input", "in.txt", "--store", "s", "--output", "out.npy"),
            ],
        }
        if args.families:
            for name, code in FAMILY_IMPORTS.items():
                commands[f"imports: {name}"] = [*py, "-c", code]
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            from benchmarks.shapes import build_bert_char

            bert = work / "bert-char-512x8"
            bert.mkdir()
            build_bert_char(bert)
            ntv2 = roots[-1] / "tests" / "fixtures" / "ntv2" / "ntv2"
            for name, path in [("BERT 512x8", bert), ("NT-v2 tiny", ntv2)]:
                commands[f"load: {name}"] = [*py, "-c", LOAD.format(path=str(path))]
        limits = {"--help": 1.0, "versions": 1.0, "models": 1.0}
        limits["embed kmer-4 (10 seqs)"] = 1.5
        limits.update({k: 2.5 for k in commands if k.startswith("imports: hf")})
        limits.update({k: 2.5 for k in commands if k.startswith("imports: ntv2")})
        limits.update({k: 2.5 for k in commands if k.startswith("load: ")})
        # the store exists before `store ls` is timed
        subprocess.run(
            commands["embed kmer-4 (10 seqs)"],
            cwd=work,
            env={**os.environ, "PYTHONPATH": str(roots[-1])},
            capture_output=True,
            check=True,
        )
        header = f"{'command':<26}" + "".join(f"{r.name:>14}" for r in roots)
        print(
            f"best of {args.rounds} wall seconds; checkouts: {[str(r) for r in roots]}"
        )
        print(header + "     limit")
        for name, cmd in commands.items():
            cells = "".join(
                f"{best_wall(cmd, root=r, cwd=work, rounds=args.rounds):>14.2f}"
                for r in roots
            )
            limit = f"{limits[name]:>10.1f}" if name in limits else ""
            print(f"{name:<26}{cells}{limit}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
