"""The embedding options `embed`, `embeddings` and `serve` share: what a key records
(dtype, layer, pooling ...) and how a model runs (device, threads, token budget).
"""

from __future__ import annotations

import argparse

from embedcache.cli.common import positive_int
from embedcache.models.options import POOLINGS

# the destinations of the options of one model that add_model_options adds (all but
# --threads, which is the process's)
MODEL_OPTIONS = (
    "revision",
    "dtype",
    "device",
    "rc",
    "layer",
    "layers",
    "pooling",
    "random_init",
    "family_option",
    "include_special_tokens",
    "truncate",
    "kmer_split",
    "trust_remote_code",
    "token_budget",
)


def add_model_options(p: argparse.ArgumentParser) -> None:
    """The options that choose what a model computes and how it runs."""
    p.add_argument(
        "--revision", default=None, help="hub revision; resolved to a commit sha"
    )
    p.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16"),
        default="auto",
        help="compute dtype; auto: the fast one where the model runs, bfloat16 on "
        "a GPU with bf16 or a CPU with AMX / AVX-512 BF16, else float32 (the key "
        "records the resolved dtype: pin it when machines of different kinds "
        "share a store)",
    )
    p.add_argument(
        "--device", default="auto", help="auto (cuda if present), cpu, cuda, cuda:N"
    )
    p.add_argument(
        "--rc",
        choices=("none", "average"),
        default=None,
        help="reverse-complement mode (default: the family's)",
    )
    p.add_argument(
        "--layer", type=int, default=-1, help="hidden layer to pool (-1: last)"
    )
    p.add_argument(
        "--layers",
        default=None,
        metavar="all|L1,L2,...",
        help="a layer sweep from one forward pass, each layer under its own key: "
        "'all' (the last, -1, then 0 = embeddings and every block before the "
        "last) or a comma list such as 2,6,12 (the first listed goes to --output)",
    )
    p.add_argument(
        "--pooling",
        choices=POOLINGS,
        default="mean",
        help="mean over the sequence's tokens (the protocol's), cls (the "
        "classification token, where the family has one) or last (the last "
        "token, causal families)",
    )
    p.add_argument(
        "--random-init",
        type=int,
        default=None,
        metavar="SEED",
        help="the architecture with seeded random weights (a pretraining control)",
    )
    p.add_argument(
        "--family-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an option only the model's family understands (repeatable)",
    )
    p.add_argument(
        "--include-special-tokens",
        action="store_true",
        help="pool [CLS]/[SEP]-style tokens too",
    )
    p.add_argument(
        "--truncate",
        action="store_true",
        help="cut over-long sequences on the right (recorded in the key)",
    )
    p.add_argument(
        "--kmer-split",
        type=int,
        default=None,
        metavar="K",
        help="DNABERT-style overlapping K-mer input",
    )
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run the model repository's own code",
    )
    p.add_argument(
        "--token-budget",
        type=positive_int,
        default=None,
        help="padded tokens per forward pass (default: the model's, or the faster "
        "of it, half and twice it as timed once on this machine)",
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="torch CPU threads (default: torch's, one per core; on a busy "
        "shared machine 1 can be faster); with --cluster local:N, threads per worker",
    )


def _family_options(pairs: list[str]) -> tuple[tuple[str, str], ...]:
    from embedcache.errors import AdapterOptionError

    out = []
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            msg = f"--family-option {pair!r} is not NAME=VALUE"
            raise AdapterOptionError(msg)
        out.append((name.strip(), value.strip()))
    return tuple(out)


def embed_options(args: argparse.Namespace) -> dict[str, object]:
    """The EmbedOptions fields the embedding commands set; ``layers`` as given."""
    return {
        "dtype": args.dtype,
        "device": args.device,
        "rc_mode": args.rc,
        "layers": args.layers,
        "layer": args.layer,
        "pooling": args.pooling,
        "special_tokens": "include" if args.include_special_tokens else "exclude",
        "truncation": "right" if args.truncate else "error",
        "kmer_split": args.kmer_split,
        "random_init": args.random_init,
        "family_options": _family_options(args.family_option),
        "trust_remote_code": args.trust_remote_code,
    }


__all__ = ["MODEL_OPTIONS", "add_model_options", "embed_options"]
