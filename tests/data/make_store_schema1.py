"""How ``store-schema1/`` was written: by the schema-1 store at commit e5f0cc7.

Kept as a record (it needs that embedcache to run); the test that reads and
migrates the fixture rebuilds the same hashes and vectors with ``expected()``.

    git worktree add /tmp/e5f0cc7 e5f0cc7
    PYTHONPATH=/tmp/e5f0cc7 python tests/data/make_store_schema1.py OUT
"""

from __future__ import annotations

import hashlib
import sys

import numpy as np

from embedcache.specs import ModelKey

KEY_A = ModelKey(
    model_id="fixture/a", revision="a" * 40, adapter="t", adapter_version="1"
)
KEY_B = ModelKey(
    model_id="fixture/b",
    revision="b" * 40,
    adapter="t",
    adapter_version="1",
    rc_mode="average",
)


def expected() -> dict[ModelKey, tuple[list[str], np.ndarray]]:
    """The hashes and vectors stored per key (key A: 12 x 4, key B: 7 x 3)."""

    def hashes(n: int, prefix: str) -> list[str]:
        return [hashlib.sha256(f"{prefix}{i}".encode()).hexdigest() for i in range(n)]

    def vectors(n: int, dim: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        return rng.standard_normal((n, dim)).astype(np.float32)

    return {
        KEY_A: (hashes(12, "a"), vectors(12, 4, 1)),
        KEY_B: (hashes(7, "b"), vectors(7, 3, 2)),
    }


def main(root: str) -> None:
    from embedcache.store import EmbeddingStore

    data = expected()
    store = EmbeddingStore(root, writer_id="schema1", auto_merge=0)
    ha, va = data[KEY_A]
    store.put(KEY_A, ha[:5], va[:5])
    store.put(KEY_A, ha[3:9], va[3:9])  # rows 3, 4 already stored: skipped
    store.put(KEY_A, ha[9:], va[9:])
    store.compact(KEY_A)  # key A: one merged shard, its predecessors retired
    hb, vb = data[KEY_B]
    store.put(KEY_B, hb[:4], vb[:4])
    store.put(KEY_B, hb[4:], vb[4:])  # key B: two committed shards


if __name__ == "__main__":
    main(sys.argv[1])
