"""The sequences the NT-v2 and GENA-LM equality fixtures are computed on.

About two dozen, chosen to reach the tokenizers' corners: lengths 1 to 300, lengths
that are and are not multiples of 6 (NT-v2's 6-mers leave single bases over), N alone,
in short runs and in a run of 10 or more (GENA-LM's normaliser turns that into one
``-`` token), lower case (embedcache upper-cases before tokenising, so the fixtures
hold the official output on the upper-cased sequence), one exact duplicate and one
exact reverse-complement pair. Deterministic: no argument changes the list.
"""

from __future__ import annotations

import random

from fixture_writer import lower_second_half, random_bases, reverse_complement

SHORT = [
    "A",
    "GT",
    "ACGTN",
    "acgtA",
    "NNNNNNNN",
    "ACGTAC",
    "ACGTACG",
    "TTGCAnnGCA",
    "GATTACAGATTACAGATTACAGATTACA",
    "ccgGGAATTCCNNacgtTTGACAGGCTaa",
    "ACGTGTACNTGCACGGANCGACTAGTCTGA",
    "TTTTTTTTTTTTNNNNNNNNNNNNAAAAAAAAAAAA",
]


def fixture_sequences() -> list[str]:
    """Every fixture sequence, in a fixed order."""
    rng = random.Random(20261006)
    out = list(SHORT)
    for n in (12, 37, 61, 97, 150, 151, 199, 250, 251, 300):
        text = random_bases(rng, n, n_run_from=150)
        out.append(lower_second_half(text) if n > 50 else text)
    pair = "".join(rng.choice("ACGT") for _ in range(43))
    out += [pair, reverse_complement(pair), out[8]]  # an RC pair and a duplicate
    return out


__all__ = ["fixture_sequences", "reverse_complement"]
