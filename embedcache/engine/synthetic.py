"""Random ACGT sequences a model takes: inputs for runs that measure or test a model
rather than embed data (the token budget's tuning, the server's canary and warm-up)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from embedcache.models.base import Adapter


def random_bases(n: int, *, seed: int) -> str:
    """``n`` random bases (A, C, G, T), the same for the same seed."""
    rng = np.random.default_rng(seed)
    return "".join(rng.choice(list("ACGT"), size=n))


def fitting_sequence(adapter: Adapter, n_bases: int, *, seed: int) -> str:
    """A random ACGT sequence of at most ``n_bases`` the model's context holds: halved
    until its tokens fit (a BPE model's token count depends on the bases, so the
    sequence itself is counted, not its length)."""
    seq = random_bases(n_bases, seed=seed)
    limit = adapter.max_tokens
    while limit is not None and len(seq) > 1 and adapter.n_tokens(seq) > limit:
        seq = seq[: len(seq) // 2]
    return seq


__all__ = ["fitting_sequence", "random_bases"]
