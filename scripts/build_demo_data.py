"""Rebuild the bundled demo data from the published test sets in ../shared/data.

Usage: .venv/bin/python scripts/build_demo_data.py [--shared-data ../shared/data] [--check]

Draws 1,200 sequences per dataset (stratified by label, largest-remainder quotas,
seed-hash rank with the protocol's seed, over ids of the rows of `test.tsv`) from the two
datasets whose sequences are available offline, and writes them as zstd parquet in the
hub layout embedcache reads: embedcache/data/demo/<dataset>/data/demo-00000-of-00001.parquet.
`--check` rebuilds in memory and fails unless the bundled files are byte-identical.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import polars as pl

from embedcache.data.datasets import DEMO_DATA_DIR, file_sha256, validate_rows
from embedcache.data.subsets import draw_stratified

DATASETS = ("human_enhancers_cohn", "human_nontata_promoters")
N_PER_DATASET = 1200
SEED = 20261006


def build(shared_data: Path, dataset: str) -> bytes:
    raw = pl.read_csv(
        shared_data / "genomic-benchmarks" / dataset / "test.tsv", separator="\t"
    )
    pool = validate_rows(raw.select("seq", "label"), dataset=dataset, split="test")
    drawn = draw_stratified(pool, N_PER_DATASET, seed=SEED, what=f"{dataset} test.tsv")
    buffer = io.BytesIO()
    drawn.select("seq", pl.col("label").cast(pl.Int64)).write_parquet(
        buffer, compression="zstd", compression_level=19, statistics=False
    )
    return buffer.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root = Path(__file__).resolve().parents[1]
    parser.add_argument(
        "--shared-data", type=Path, default=root.parent / "shared" / "data"
    )
    parser.add_argument(
        "--check", action="store_true", help="verify instead of writing"
    )
    args = parser.parse_args()
    ok = True
    for dataset in DATASETS:
        payload = build(args.shared_data, dataset)
        target = DEMO_DATA_DIR / dataset / "data" / "demo-00000-of-00001.parquet"
        if args.check:
            same = target.exists() and target.read_bytes() == payload
            print(f"{dataset}: {'identical' if same else 'DIFFERS'} ({target})")
            ok &= same
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(payload)
        print(
            f"{dataset}: {len(payload):,} bytes, sha256 {file_sha256(target)} -> {target}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
