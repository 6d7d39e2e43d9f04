"""Embedding store vs plain np.save/np.load, measured side by side in one run.

40,982 x 512 float32 vectors (one atlas-full-v1 run of a 512-wide model):
write, full read, random-order lookups of all 41k hashes; plus the compressors
considered for the vector chunks (ratio and speed on the same array).

    python benchmarks/store_bench.py [--embeddings real.npy] [--dir TMP]

``--embeddings`` measures the compressors on real embeddings too (any (n, d)
float32 .npy). The figures are page-cache figures: the files were just written.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import google_crc32c
import numpy as np
from numcodecs import Blosc, Zstd

from embedcache.specs import ModelKey
from embedcache.store import EmbeddingStore

if TYPE_CHECKING:
    from collections.abc import Callable

N, DIM = 40_982, 512
KEY = ModelKey(
    model_id="bench/model", revision="0" * 40, adapter="bench", adapter_version="1"
)


def best(fn: Callable[[], object], repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def embeddings_like(n: int, dim: int, seed: int = 0) -> np.ndarray:
    """Dense float32 vectors shaped like mean-pooled LM outputs.

    Low-rank structure, a shared offset and a few outlier channels (anisotropy),
    plus per-vector noise: mantissas are as random as in real embeddings, which is
    what decides how well they compress.
    """
    rng = np.random.default_rng(seed)
    basis = rng.standard_normal((48, dim)).astype(np.float32)
    x = rng.standard_normal((n, 48)).astype(np.float32) @ basis * 0.15
    x += rng.standard_normal(dim).astype(np.float32) * 0.5
    x[:, rng.choice(dim, 4, replace=False)] *= 8.0
    x += rng.standard_normal((n, dim)).astype(np.float32) * 0.2
    return x.astype(np.float32)


def codec_table(name: str, array: np.ndarray) -> None:
    codecs = {
        "none": None,
        "zstd-1": Zstd(level=1),
        "zstd-3": Zstd(level=3),
        "blosc-lz4-shuffle": Blosc("lz4", 5, Blosc.SHUFFLE),
        "blosc-lz4-bitshuffle": Blosc("lz4", 5, Blosc.BITSHUFFLE),
        "blosc-zstd1-shuffle": Blosc("zstd", 1, Blosc.SHUFFLE),
        "blosc-zstd3-bitshuffle": Blosc("zstd", 3, Blosc.BITSHUFFLE),
    }
    rows = max(1, (1 << 21) // (4 * array.shape[1]))  # the store's ~2 MiB chunks
    chunks = [
        np.ascontiguousarray(array[i : i + rows]) for i in range(0, len(array), rows)
    ]
    print(f"\ncompressors on {name} {array.shape}, {rows}-row chunks:")
    print(f"  {'codec':24} {'ratio':>6} {'encode MB/s':>12} {'decode MB/s':>12}")
    for cname, codec in codecs.items():
        if codec is None:
            print(f"  {cname:24} {1.0:>6.3f} {'-':>12} {'-':>12}")
            continue
        encoded = [codec.encode(c) for c in chunks]
        t_enc = best(lambda codec=codec: [codec.encode(c) for c in chunks], 2)
        t_dec = best(
            lambda codec=codec, encoded=encoded: [codec.decode(e) for e in encoded], 2
        )
        ratio = array.nbytes / sum(len(e) for e in encoded)
        mb = array.nbytes / 1e6
        print(f"  {cname:24} {ratio:>6.3f} {mb / t_enc:>12.0f} {mb / t_dec:>12.0f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--embeddings", type=Path, help="real embeddings (.npy) for the codec table"
    )
    parser.add_argument("--dir", type=Path, help="where to write (default: a temp dir)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="store_bench_", dir=args.dir))
    try:
        run(work, args.embeddings)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def run(work: Path, real: Path | None) -> None:
    vectors = embeddings_like(N, DIM)
    hashes = [hashlib.sha256(f"seq-{i}".encode()).hexdigest() for i in range(N)]
    rng = np.random.default_rng(1)
    perm = rng.permutation(N)
    shuffled = [hashes[i] for i in perm]
    mb = vectors.nbytes / 1e6
    print(f"{N} x {DIM} float32 = {mb:.1f} MB")

    # --- write
    raw = work / "raw.npy"
    t_save = best(lambda: np.save(raw, vectors), 3)

    def save_fsync() -> None:
        with raw.open("wb") as f:
            np.save(f, vectors)
            f.flush()
            os.fsync(f.fileno())

    t_save_sync = best(save_fsync, 3)

    def write_store() -> None:
        shutil.rmtree(work / "store", ignore_errors=True)
        EmbeddingStore(work / "store").put(KEY, hashes, vectors)

    t_put = best(write_store, 3)
    batched = EmbeddingStore(work / "batched")
    t = time.perf_counter()
    for i in range(0, N, 256):
        batched.put(KEY, hashes[i : i + 256], vectors[i : i + 256])
    t_batched = time.perf_counter() - t
    n_shards = batched.keys()[0].n_shards
    store = EmbeddingStore(work / "store")
    nbytes = store.keys()[0].nbytes
    print("\nwrite (the store fsyncs every file and directory it commits):")
    print(f"  np.save                       {t_save:8.3f} s")
    print(f"  np.save + fsync               {t_save_sync:8.3f} s")
    print(
        f"  store.put, one commit         {t_put:8.3f} s  "
        f"({t_put / t_save_sync:.1f}x np.save + fsync)"
    )
    print(
        f"  store.put, 161 commits of 256 {t_batched:8.3f} s  "
        f"({t_batched / 161 * 1e3:.1f} ms/commit incl. auto-merges; {n_shards} shards left)"
    )
    print(
        f"  on disk {nbytes / 1e6:.1f} MB (ratio {vectors.nbytes / nbytes:.3f}: codec none + crc32c)"
    )

    # --- read
    t_load = best(lambda: np.load(raw))

    def cold_get() -> np.ndarray:
        return EmbeddingStore(work / "store").get(KEY, hashes)[0]

    out = cold_get()
    assert np.array_equal(out, vectors)
    t_cold = best(cold_get)
    t_warm = best(lambda: store.get(KEY, hashes))
    t_open = best(lambda: EmbeddingStore(work / "store").contains(KEY, hashes[:1]))
    print("\nfull read of all vectors (page cache):")
    print(f"  np.load                       {t_load:8.4f} s  ({mb / t_load:,.0f} MB/s)")
    print(
        f"  store.get, open + index + read {t_cold:7.4f} s  "
        f"(speed {t_load / t_cold:.2f}x np.load)"
    )
    print(
        f"  store.get, already open       {t_warm:8.4f} s  "
        f"(speed {t_load / t_warm:.2f}x np.load)"
    )
    print(f"  open + load the 41k-hash index {t_open:7.4f} s")

    # --- lookups
    t_contains = best(lambda: store.contains(KEY, shuffled))
    t_get_rand = best(lambda: store.get(KEY, shuffled))
    got, found = store.get(KEY, shuffled)
    assert found.all()
    assert np.array_equal(got, vectors[perm])
    t_fancy = best(lambda: np.load(raw)[perm])
    print("\nrandom-order lookups of all 41k hashes:")
    print(f"  store.contains (index only)   {t_contains:8.4f} s")
    print(f"  store.get (index + vectors)   {t_get_rand:8.4f} s")
    print(
        f"  np.load + fancy index by row  {t_fancy:8.4f} s  (needs row numbers, not hashes)"
    )

    # --- integrity checks on the read path: what each would cost per full read
    body = np.frombuffer(vectors.tobytes(), np.uint8)
    t_crc = best(lambda: google_crc32c.value(body))
    t_sha = best(lambda: hashlib.sha256(body).digest(), 3)
    print(
        "\nchecksum cost over all 84 MB (why get checks crc32c per chunk, not sha256):"
    )
    print(
        f"  crc32c {t_crc:.4f} s ({mb / t_crc:,.0f} MB/s)   sha256 {t_sha:.4f} s ({mb / t_sha:,.0f} MB/s)"
    )

    # --- through zarr's own reader, for reference
    import zarr

    (shard,) = (work / "store" / KEY.digest / "shards").iterdir()
    t_zarr = best(lambda: zarr.open_array(shard / "vectors", mode="r")[:], 3)
    print(
        f"\nsame shard through zarr.open_array()[:]  {t_zarr:.4f} s  ({t_load / t_zarr:.2f}x np.load)"
    )

    codec_table("embeddings_like (synthetic)", vectors[:8192])
    if real is not None:
        codec_table(f"real embeddings {real.name}", np.load(real).astype(np.float32))


if __name__ == "__main__":
    main()
