"""`embedcache serve` whose k-mer model gives NaN for one marker sequence: a model
failing on one request's item, for the test that it fails only that request.

Run as ``python -m tests.service.poisoned_serve serve ...`` (the CLI's arguments).
"""

from __future__ import annotations

import sys

import numpy as np

from embedcache.cli import main
from embedcache.models.kmer import KmerAdapter

MARKER = "GATTACAGATTACAGATTACA"


def _poisoned(embed_batch):
    def embed(self, seqs):
        vectors = np.array(embed_batch(self, seqs), dtype=np.float32)
        for i, seq in enumerate(seqs):
            if seq.startswith(MARKER):
                vectors[i] = np.nan
        return vectors

    return embed


if __name__ == "__main__":
    KmerAdapter.embed_batch = _poisoned(KmerAdapter.embed_batch)
    sys.exit(main(sys.argv[1:]))
