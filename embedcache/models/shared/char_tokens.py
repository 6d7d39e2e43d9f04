"""One token per base: the lookup tables of the character-level families.

HyenaDNA and Caduceus share their tokenizers' ids (A 7, C 8, G 9, T 10, N 11, anything
else [UNK] 6); a table over the 256 byte values maps a whole sequence in one step.
"""

from __future__ import annotations

import numpy as np

UNK_ID = 6
BASE_IDS = {"A": 7, "C": 8, "G": 9, "T": 10, "N": 11}


def token_table(*, lower: bool) -> np.ndarray:
    """int64 ids by byte value; ``lower``: lower-case bases map as upper-case ones
    (the official tokenizer upper-cases first), else they are [UNK]."""
    table = np.full(256, UNK_ID, dtype=np.int64)
    for base, token in BASE_IDS.items():
        table[ord(base)] = token
        if lower:
            table[ord(base.lower())] = token
    return table


def lookup(table: np.ndarray, seq: str) -> np.ndarray:
    """The ids of ``seq``'s characters in ``table`` (int64, one per character)."""
    raw = np.frombuffer(seq.encode("latin-1", errors="replace"), dtype=np.uint8)
    return table[raw]


__all__ = ["BASE_IDS", "UNK_ID", "lookup", "token_table"]
