"""The options a user sets when embedding: one frozen record, validated once.

Every option that changes a vector ends up in the adapter's :class:`ModelKey`; the
rest (device) only decides where the work runs. The record is plain data, so it can
be pickled to another process (a Dask worker loads the same adapter from it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from embedcache.errors import AdapterOptionError

DTYPES = ("float32", "bfloat16", "auto")  # auto: resolved when the model loads
POOLINGS = ("mean", "cls", "last")
SPECIAL_TOKEN_POLICIES = ("exclude", "include")
TRUNCATION_POLICIES = ("error", "right")
RC_MODES = ("none", "average")
LAST_LAYER = -1


@dataclass(frozen=True, slots=True)
class EmbedOptions:
    """How to embed: compute dtype, device, pooling, layers, strands, truncation.

    Parameters
    ----------
    dtype
        Compute dtype; vectors are stored as float32 whatever it is. ``"auto"`` is
        resolved when the model loads to the fast one where it runs (bfloat16 on a
        GPU with bf16 or a CPU with AMX / AVX-512 BF16, else float32); the key records
        the resolved dtype.
    device
        ``"auto"`` (CUDA when present), ``"cpu"``, ``"cuda"`` or ``"cuda:<i>"``.
    rc_mode
        None takes the family's default; ``"average"`` is the mean of the pooled
        forward and reverse-complement passes.
    layers
        Hidden layers to pool, each stored under its own key: -1 is the final output
        (the protocol's), 0 the embedding output, ``i`` the output of block ``i``.
    pooling
        ``"mean"`` over the sequence's tokens (the protocol's), ``"cls"`` (the first,
        classification token, where the family has one) or ``"last"`` (the last token
        of a causal model).
    special_tokens
        Whether [CLS]/[SEP]-style tokens enter the mean.
    truncation
        ``"error"``: a sequence longer than the context raises; ``"right"``: it is cut.
    kmer_split
        DNABERT-1-style overlapping k-mer input for generic encoders.
    random_init
        Build the architecture from its config with seeded random weights (the
        family's own initialisation) instead of loading the trained ones.
    family_options
        Options only one family understands, as sorted ``(name, value)`` pairs
        (e.g. GENERator's remainder handling); the family validates them.
    trust_remote_code
        Let an unrecognised checkpoint run its repository's own code (the user's
        own opt-in; recognised families never run remote code).
    """

    dtype: str = "float32"
    device: str = "auto"
    rc_mode: str | None = None
    layers: tuple[int, ...] = (LAST_LAYER,)
    pooling: str = "mean"
    special_tokens: str = "exclude"
    truncation: str = "error"
    kmer_split: int | None = None
    random_init: int | None = None
    family_options: tuple[tuple[str, str], ...] = field(default=())
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        _check("dtype", self.dtype, DTYPES)
        _check("pooling", self.pooling, POOLINGS)
        _check("special-token policy", self.special_tokens, SPECIAL_TOKEN_POLICIES)
        _check("truncation policy", self.truncation, TRUNCATION_POLICIES)
        if self.rc_mode is not None:
            _check("rc mode", self.rc_mode, RC_MODES)
        layers = tuple(int(layer) for layer in self.layers)
        if not layers:
            msg = "at least one layer must be asked for (-1 is the last)"
            raise AdapterOptionError(msg)
        if len(set(layers)) != len(layers):
            msg = f"layers {list(layers)} name a layer twice"
            raise AdapterOptionError(msg)
        if any(layer < LAST_LAYER for layer in layers):
            msg = f"layers {list(layers)}: a layer is -1 (last) or a block index >= 0"
            raise AdapterOptionError(msg)
        object.__setattr__(self, "layers", layers)
        if self.kmer_split is not None and not 1 <= self.kmer_split <= 12:
            msg = f"kmer split {self.kmer_split} is outside 1..12"
            raise AdapterOptionError(msg)
        if self.random_init is not None and self.random_init < 0:
            msg = f"random-init seed {self.random_init} must be >= 0"
            raise AdapterOptionError(msg)
        pairs = tuple(sorted((str(k), str(v)) for k, v in self.family_options))
        object.__setattr__(self, "family_options", pairs)

    @property
    def family_option_map(self) -> dict[str, str]:
        return dict(self.family_options)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# how each option is spelled on the command line, for messages
FLAGS = {
    "dtype": "--dtype",
    "device": "--device",
    "rc_mode": "--rc",
    "layers": "--layer/--layers",
    "pooling": "--pooling",
    "special_tokens": "--include-special-tokens",
    "truncation": "--truncate",
    "kmer_split": "--kmer-split",
    "random_init": "--random-init",
    "family_options": "--family-option",
    "trust_remote_code": "--trust-remote-code",
}


def non_default(options: EmbedOptions, names: tuple[str, ...]) -> list[str]:
    """The command-line flags among ``names`` that ``options`` sets away from the default."""
    defaults = EmbedOptions()
    return [FLAGS[n] for n in names if getattr(options, n) != getattr(defaults, n)]


def random_init_revision(seed: int) -> str:
    """The revision a random-init twin records instead of the trained weights'."""
    return f"random-init:{seed}"


def _check(what: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        msg = f"{what} {value!r} is not one of {', '.join(allowed)}"
        raise AdapterOptionError(msg)


__all__ = [
    "DTYPES",
    "FLAGS",
    "LAST_LAYER",
    "POOLINGS",
    "RC_MODES",
    "SPECIAL_TOKEN_POLICIES",
    "TRUNCATION_POLICIES",
    "EmbedOptions",
    "non_default",
    "random_init_revision",
]
