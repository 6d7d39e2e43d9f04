"""`embedcache serve` whose k-mer model gives NaN for one marker sequence (a model
failing on one request's item), takes seconds over another (a slow pass, for the
request deadline) and runs torch for long over a third (a pass in native threads
that outlives the drain deadline).

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
TORCH_SLOW = "TGATGATGATGATGA"
TORCH_SECONDS = 30.0
TORCH_STARTED = "poisoned: a torch pass started"


def _poisoned(embed_batch):
    def embed(self, seqs):
        vectors = np.array(embed_batch(self, seqs), dtype=np.float32)
        for i, seq in enumerate(seqs):
            if seq.startswith(MARKER):
                vectors[i] = np.nan
            if seq.startswith(SLOW):
                time.sleep(SLOW_SECONDS)
            if seq.startswith(TORCH_SLOW):
                _torch_for(TORCH_SECONDS)
        return vectors

    return embed


def _torch_for(seconds: float) -> None:
    import torch

    a = torch.randn(256, 256)
    sys.stderr.write(TORCH_STARTED + "\n")
    sys.stderr.flush()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        a @ a


if __name__ == "__main__":
    KmerAdapter.embed_batch = _poisoned(KmerAdapter.embed_batch)
    sys.exit(main(sys.argv[1:]))
