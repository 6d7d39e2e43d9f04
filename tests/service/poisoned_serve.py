"""`embedcache serve` whose k-mer model gives NaN for one marker sequence (a model
failing on one request's item) and takes seconds over another (a slow pass, for the
request deadline).

Run as ``python -m tests.service.poisoned_serve serve ...`` (the CLI's arguments).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from embedcache.cli import main
from embedcache.models.floors.kmer import KmerAdapter

MARKER = "GATTACAGATTACAGATTACA"
SLOW = "CATCATCATCATCAT"
SLOW_SECONDS = 3.0


def _poisoned(embed_batch):
    def embed(self, seqs):
        vectors = np.array(embed_batch(self, seqs), dtype=np.float32)
        for i, seq in enumerate(seqs):
            if seq.startswith(MARKER):
                vectors[i] = np.nan
            if seq.startswith(SLOW):
                time.sleep(SLOW_SECONDS)
        return vectors

    return embed


if __name__ == "__main__":
    KmerAdapter.embed_batch = _poisoned(KmerAdapter.embed_batch)
    sys.exit(main(sys.argv[1:]))
