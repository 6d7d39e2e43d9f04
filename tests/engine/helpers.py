"""Shared by the engine and CLI tests: an in-memory store, sequences, a small version."""

from __future__ import annotations

import numpy as np


class MemoryStore:
    """The store's lookup/put contract in memory, counting puts (one per committed batch)."""

    def __init__(self):
        self.data = {}
        self.puts = []
        self.aliases = {}
        self.kernels = []  # what each committing put said computed its vectors

    def contains(self, key, hashes):
        return np.array([(key, h) in self.data for h in hashes], dtype=bool)

    def get(self, key, hashes):
        found = self.contains(key, hashes)
        dim = next((v.shape[0] for (k, _), v in self.data.items() if k == key), 0)
        out = np.full((len(hashes), dim), np.nan, dtype=np.float32)
        for row, digest in enumerate(hashes):
            if found[row]:
                out[row] = self.data[key, digest]
        return out, found

    def put(self, key, hashes, vectors, alias=None, kernels=None):
        # as the real store: a call commits only new rows or a new alias
        fresh = [(h, v) for h, v in zip(hashes, vectors, strict=True)]
        fresh = [(h, v) for h, v in fresh if (key, h) not in self.data]
        known = self.aliases.setdefault(key, set())
        if not fresh and (alias is None or alias in known):
            return 0
        self.puts.append(len(hashes))
        self.kernels.append(kernels)
        known.update({alias} - {None})
        for digest, vector in fresh:
            self.data[key, digest] = np.array(vector, dtype=np.float32)
        return len({h for h, _ in fresh})


def random_seqs(n, *, seed=0, low=5, high=40):
    rng = np.random.default_rng(seed)
    return [
        "".join(rng.choice(list("ACGT"), size=rng.integers(low, high)))
        for _ in range(n)
    ]


def write_small_version(path):
    """demo-v1's datasets drawn smaller (20 train + 30 test each): a tiny BERT's share."""
    entry = (
        '\n[[datasets]]\nname = "{name}"\nsource = "demo"\ntest_split = "demo"\n'
        'train_split = "demo"\nn_test = 30\nn_train = 20\n'
    )
    text = 'name = "small-demo"\nseed = 20261006\ncomparable = false\n'
    text += "".join(
        entry.format(name=n)
        for n in ("human_enhancers_cohn", "human_nontata_promoters")
    )
    path.write_text(text)
    return path
