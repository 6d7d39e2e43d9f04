"""How far a vector computed inside a mixed batch is from the same sequence alone.

The service batches misses across requests, so a sequence's batch-mates (and
padding) depend on what else is queued. This measures, for the tests' tiny random
BERT (2 layers, width 16) in fp32 and bf16, the max absolute and relative
difference between each sequence embedded alone and inside the length-sorted
batches the engine's rule cuts from a mixed queue (20-62 bp).

    PYTHONPATH=$PWD python benchmarks/serve_batch_deviation.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np


def main() -> None:
    import torch

    from embedcache.engine.batching import batch_rule, plan_batches
    from embedcache.engine.forward import embed_outputs
    from embedcache.models import load_adapter
    from tests.conftest import save_tiny_bert

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    seqs = [
        "".join(rng.choice(list("ACGT"), size=int(rng.integers(20, 62))))
        for _ in range(96)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        folder = save_tiny_bert(Path(tmp) / "tiny-bert")
        print(
            f"{len(seqs)} sequences of 20-62 bp, tiny random BERT (2 layers, width 16)"
        )
        for dtype in ("float32", "bfloat16"):
            adapter = load_adapter(str(folder), dtype=dtype, device="cpu")
            rule = batch_rule(adapter)
            tokens = [adapter.n_tokens(s) for s in seqs]
            batches = plan_batches(tokens, rule)
            with torch.inference_mode():
                alone = np.concatenate([embed_outputs(adapter, [s])[0] for s in seqs])
                mixed = np.zeros_like(alone)
                for batch in batches:
                    mixed[batch] = embed_outputs(adapter, [seqs[i] for i in batch])[0]
            diff = np.abs(mixed - alone)
            rel = diff / np.maximum(np.abs(alone), 1e-6)
            norm_rel = np.linalg.norm(mixed - alone, axis=1) / np.linalg.norm(
                alone, axis=1
            )
            print(
                f"{dtype:>9}: {len(batches)} batches of up to {max(map(len, batches))}; "
                f"max abs diff {diff.max():.3g}, max elementwise rel diff {rel.max():.3g}, "
                f"max per-vector rel L2 diff {norm_rel.max():.3g}"
            )


if __name__ == "__main__":
    main()
