"""Embedding store vs plain np.save/np.load, and a local folder vs an S3 server.

40,982 x 512 float32 vectors (one atlas-full-v1 run of a 512-wide model): write,
full read, random-order lookups of all 41k hashes, commit latency, and the cost of
listing and opening a key of 2,000 commit records, on a local folder and on a
moto S3 server (started here as a separate process, on 127.0.0.1). Ratios are
measured side by side in one run; local figures are page-cache figures.

    python benchmarks/store_bench.py [--dir TMP] [--records 2000] [--no-s3]
        [--embeddings real.npy]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import google_crc32c
import numpy as np
import obstore
from numcodecs import Blosc, Zstd

from benchmarks.turns import side_by_side
from embedcache.specs import ModelKey
from embedcache.store import EmbeddingStore, open_object_store, shards

if TYPE_CHECKING:
    from collections.abc import Callable

N, DIM = 40_982, 512
KEY = ModelKey(
    model_id="bench/model", revision="0" * 40, adapter="bench", adapter_version="1"
)
SMALL = ModelKey(
    model_id="bench/records", revision="0" * 40, adapter="bench", adapter_version="1"
)
CREDENTIALS = {"aws_access_key_id": "bench", "aws_secret_access_key": "bench"}


def best(fn: Callable[[], object], repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def once(fn: Callable[[], object]) -> float:
    return best(fn, 1)


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


def seq_hashes(n: int, prefix: str = "seq") -> list[str]:
    return [hashlib.sha256(f"{prefix}-{i}".encode()).hexdigest() for i in range(n)]


# --- the S3 server ------------------------------------------------------------------


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    """A moto S3 server in its own process (so it does not share our GIL)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve = "from moto.server import main; main()"
    proc = subprocess.Popen(
        [sys.executable, "-c", serve, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            break
        except OSError:
            time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port}"


def s3_location(endpoint: str) -> tuple[str, dict[str, str]]:
    import boto3

    bucket = f"bench-{secrets.token_hex(4)}"
    boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", **CREDENTIALS
    ).create_bucket(Bucket=bucket)
    options = {
        **CREDENTIALS,
        "aws_region": "us-east-1",
        "aws_endpoint_url": endpoint,
        "aws_allow_http": "true",
    }
    return f"s3://{bucket}/store", options


# --- sections -----------------------------------------------------------------------


def bench_local(
    work: Path, vectors: np.ndarray, hashes: list[str], *, extras: bool = True
) -> None:
    mb = vectors.nbytes / 1e6
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
    print("\nlocal write (the store fsyncs every object it commits):")
    print(f"  np.save                        {t_save:8.3f} s")
    print(f"  np.save + fsync                {t_save_sync:8.3f} s")
    print(
        f"  store.put, one commit          {t_put:8.3f} s  "
        f"({t_save_sync / t_put:.2f}x the speed of np.save + fsync)"
    )

    store = EmbeddingStore(work / "store")
    import zarr

    (shard,) = (work / "store" / KEY.digest / "shards").glob("*~*")

    def cold_get() -> np.ndarray:
        return EmbeddingStore(work / "store").get(KEY, hashes)[0]

    assert np.array_equal(cold_get(), vectors)
    by_hash = store.hashes(KEY)  # what an export asks for: the key's sorted hashes
    t = side_by_side(
        {
            "np.load": lambda: np.load(raw),
            "cold": cold_get,
            "warm": lambda: store.get(KEY, hashes),
            "sorted": lambda: store.get(KEY, by_hash),
            "zarr": lambda: zarr.open_array(shard / "vectors", mode="r")[:],
        }
    )
    t_load = t["np.load"]
    print("\nlocal full read of all vectors, in stored order (page cache; in turns):")
    print(
        f"  np.load                        {t_load:8.4f} s  ({mb / t_load:,.0f} MB/s)"
    )
    for name, label in (
        ("cold", "store.get, open + index + read"),
        ("warm", "store.get, already open       "),
        ("sorted", "store.get, open, hash order   "),
        ("zarr", "zarr.open_array(...)[:]       "),
    ):
        print(f"  {label} {t[name]:8.4f} s  (speed {t_load / t[name]:.2f}x np.load)")
    print("  (store.get validates and looks up all 41k hashes; zarr reads the array)")
    bench_lookups(store, vectors, hashes, raw)
    if extras:
        bench_chunk_sizes(work, vectors, hashes, raw)


def bench_lookups(
    store: EmbeddingStore, vectors: np.ndarray, hashes: list[str], raw: Path | None
) -> None:
    perm = np.random.default_rng(1).permutation(N)
    shuffled = [hashes[i] for i in perm]
    t_contains = best(lambda: store.contains(KEY, shuffled))
    t_get_rand = best(lambda: store.get(KEY, shuffled), 3)
    got, found = store.get(KEY, shuffled)
    assert found.all()
    assert np.array_equal(got, vectors[perm])
    print(f"  random-order lookups of all {N:,} hashes:")
    print(f"    store.contains (index only)  {t_contains:8.4f} s")
    print(f"    store.get (index + vectors)  {t_get_rand:8.4f} s")
    if raw is not None:
        t_fancy = best(lambda: np.load(raw)[perm])
        print(
            f"    np.load + fancy index by row {t_fancy:8.4f} s  "
            "(needs row numbers, not hashes)"
        )


def bench_chunk_sizes(
    work: Path, vectors: np.ndarray, hashes: list[str], raw: Path
) -> None:
    print("\n  full read (already open) by chunk size, side by side with np.load:")
    default = shards.CHUNK_BYTES
    try:
        for mib in (1, 2, 4, 8, 16):
            shards.CHUNK_BYTES = mib << 20
            root = work / f"chunks-{mib}"
            EmbeddingStore(root).put(KEY, hashes, vectors)
            store = EmbeddingStore(root)
            t = side_by_side(
                {
                    "store": lambda store=store: store.get(KEY, hashes),
                    "load": lambda: np.load(raw),
                },
                rounds=9,
            )
            t_store, t_load = t["store"], t["load"]
            mark = "  <- the store's" if mib << 20 == default else ""
            print(
                f"    {mib:2d} MiB chunks: {t_store:.4f} s vs np.load {t_load:.4f} s "
                f"= {t_load / t_store:.2f}x{mark}"
            )
            shutil.rmtree(root)
    finally:
        shards.CHUNK_BYTES = default


def bench_s3(endpoint: str, vectors: np.ndarray, hashes: list[str]) -> None:
    mb = vectors.nbytes / 1e6
    url, options = s3_location(endpoint)
    t_put = once(lambda: EmbeddingStore(url, options=options).put(KEY, hashes, vectors))
    store = EmbeddingStore(url, options=options)
    raw = open_object_store(url, options)
    chunks = [
        m["path"]
        for batch in obstore.list(raw, f"{KEY.digest}/shards/")
        for m in batch
        if "/vectors/c/" in m["path"]
    ]
    payloads = [bytes(obstore.get(raw, p).bytes()) for p in chunks]

    def raw_put() -> None:
        with ThreadPoolExecutor(16) as pool:
            list(
                pool.map(
                    lambda p: obstore.put(raw, f"raw/{p[0]}", p[1]),
                    enumerate(payloads),
                )
            )

    def raw_get() -> list[bytes]:
        with ThreadPoolExecutor(16) as pool:
            return list(pool.map(lambda p: obstore.get(raw, p).bytes(), chunks))

    t_raw_put = best(raw_put, 2)
    t_raw_get = best(raw_get, 3)

    def cold_get() -> np.ndarray:
        return EmbeddingStore(url, options=options).get(KEY, hashes)[0]

    assert np.array_equal(cold_get(), vectors)
    t_cold = best(cold_get, 3)
    t_warm = best(lambda: store.get(KEY, hashes), 3)
    t_open = best(
        lambda: EmbeddingStore(url, options=options).contains(KEY, hashes[:1]), 3
    )
    print(f"\nS3 server (moto, 127.0.0.1; {len(chunks)} vector chunks of ~4 MiB):")
    print(f"  store.put, one commit          {t_put:8.3f} s  ({mb / t_put:6.0f} MB/s)")
    print(
        f"  raw obstore put, same bytes    {t_raw_put:8.3f} s  "
        f"({mb / t_raw_put:6.0f} MB/s, 16 at once)"
    )
    print(
        f"  store.get, open + index + read {t_cold:8.3f} s  ({mb / t_cold:6.0f} MB/s)"
    )
    print(
        f"  store.get, already open        {t_warm:8.3f} s  ({mb / t_warm:6.0f} MB/s)"
    )
    print(
        f"  raw obstore get, same bytes    {t_raw_get:8.3f} s  "
        f"({mb / t_raw_get:6.0f} MB/s, 16 at once)"
    )
    print(f"  open + load the 41k-hash index {t_open:8.3f} s")
    bench_lookups(store, vectors, hashes, None)


def bench_commits(location: str | Path, options: dict[str, str] | None) -> None:
    hashes = seq_hashes(50 * 256, "commit")
    vectors = embeddings_like(len(hashes), DIM, seed=2)
    store = EmbeddingStore(location, options=options, auto_merge=0)
    times = []
    for i in range(0, len(hashes), 256):
        t = time.perf_counter()
        store.put(KEY, hashes[i : i + 256], vectors[i : i + 256])
        times.append(time.perf_counter() - t)
    ms = np.array(times) * 1e3
    merged = EmbeddingStore(location, options=options)  # default auto-merge
    more = seq_hashes(50 * 256, "commit-merge")
    t = time.perf_counter()
    for i in range(0, len(more), 256):
        merged.put(KEY, more[i : i + 256], vectors[i : i + 256])
    t_merge = (time.perf_counter() - t) / 50 * 1e3
    print(
        f"  commit latency, 256 x {DIM} rows: median {np.median(ms):.1f} ms, "
        f"p90 {np.percentile(ms, 90):.1f} ms; with auto-merge {t_merge:.1f} ms/commit"
    )


def write_records(location: Path, n: int) -> float:
    """Commit ``n`` one-row shards of one key (4 writers at once); return seconds."""
    hashes = seq_hashes(n, "rec")
    vectors = embeddings_like(n, 16, seed=3)

    def write(part: range) -> None:
        store = EmbeddingStore(location, auto_merge=0)
        for i in part:
            store.put(SMALL, hashes[i : i + 1], vectors[i : i + 1])

    EmbeddingStore(location)
    t = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(write, [range(k, n, 4) for k in range(4)]))
    return time.perf_counter() - t


def copy_store(src: Path, url: str, options: dict[str, str]) -> None:
    """Upload a local store's objects as they are (a store is location-free)."""
    dst = open_object_store(url, options)
    files = [p for p in src.rglob("*") if p.is_file()]

    def upload(path: Path) -> None:
        obstore.put(dst, path.relative_to(src).as_posix(), path.read_bytes())

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(upload, files))


def bench_records(
    name: str, location: str | Path, options: dict | None, n: int
) -> None:
    """Listing and opening a key of ``n`` commit records (n one-row shards)."""
    hashes = seq_hashes(n, "rec")
    raw = open_object_store(location, options)
    prefix = f"{SMALL.digest}/commits/"
    t_list = best(lambda: obstore.list_with_delimiter(raw, prefix), 3)
    t_cold = once(
        lambda: EmbeddingStore(location, options=options).contains(SMALL, hashes)
    )
    opened = EmbeddingStore(location, options=options)
    assert opened.contains(SMALL, hashes).all()
    t_refresh = best(lambda: opened.contains(SMALL, hashes), 3)
    t_compact = once(lambda: opened.compact(SMALL))
    t_after = best(
        lambda: EmbeddingStore(location, options=options).contains(SMALL, hashes), 3
    )
    print(f"  {name}: {n:,} commit records (one row each)")
    print(f"    list the records              {t_list * 1e3:8.1f} ms")
    print(f"    open: list + read every record and shard index {t_cold:8.2f} s")
    print(
        f"    refresh when nothing changed  {t_refresh * 1e3:8.1f} ms  (every get/put)"
    )
    print(f"    compact into one shard        {t_compact:8.2f} s")
    print(f"    open after compact            {t_after * 1e3:8.1f} ms")


def bench_merged_lookups(location: Path, commits: int) -> None:
    """~42k hashes committed in ``commits`` puts with auto-merge on, then looked up."""
    per = -(-N // commits)
    hashes = seq_hashes(per * commits, "merge")
    vectors = embeddings_like(len(hashes), 64, seed=5)
    store = EmbeddingStore(location)  # the default auto-merge
    t0 = time.perf_counter()
    for i in range(0, len(hashes), per):
        store.put(SMALL, hashes[i : i + per], vectors[i : i + per])
    t_write = time.perf_counter() - t0
    shuffled = [hashes[i] for i in np.random.default_rng(2).permutation(len(hashes))]
    t_cold = once(lambda: EmbeddingStore(location).get(SMALL, shuffled))
    t_warm = best(lambda: store.get(SMALL, shuffled), 3)
    got, found = store.get(SMALL, hashes)
    assert found.all()
    assert np.array_equal(got, vectors)
    (info,) = [k for k in store.keys() if k.digest == SMALL.digest]  # noqa: SIM118
    print(
        f"  {len(hashes):,} hashes in {commits:,} commits ({per} rows each, auto-merge"
        f" on; {t_write:.1f} s to write): {info.n_shards} shards left"
    )
    print(f"    get all, random order, fresh open {t_cold:8.3f} s   (target < 0.5 s)")
    print(f"    get all, random order, open store {t_warm:8.3f} s")


def codec_table(name: str, array: np.ndarray) -> None:
    codecs = {
        "zstd-1": Zstd(level=1),
        "blosc-lz4-shuffle": Blosc("lz4", 5, Blosc.SHUFFLE),
        "blosc-zstd1-shuffle": Blosc("zstd", 1, Blosc.SHUFFLE),
    }
    rows = max(1, shards.CHUNK_BYTES // (4 * array.shape[1]))
    chunks = [
        np.ascontiguousarray(array[i : i + rows]) for i in range(0, len(array), rows)
    ]
    print(
        f"\ncompressors on {name} {array.shape}, {rows}-row chunks (the store: none):"
    )
    print(f"  {'codec':24} {'ratio':>6} {'encode MB/s':>12} {'decode MB/s':>12}")
    mb = array.nbytes / 1e6
    for cname, codec in codecs.items():
        encoded = [codec.encode(c) for c in chunks]
        t_enc = best(lambda codec=codec: [codec.encode(c) for c in chunks], 2)
        t_dec = best(
            lambda codec=codec, encoded=encoded: [codec.decode(e) for e in encoded], 2
        )
        ratio = array.nbytes / sum(len(e) for e in encoded)
        print(f"  {cname:24} {ratio:>6.3f} {mb / t_enc:>12.0f} {mb / t_dec:>12.0f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, help="where to write (default: a temp dir)")
    parser.add_argument("--records", type=int, default=2000, help="commit records")
    parser.add_argument("--no-s3", action="store_true", help="local folder only")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="local full read and look-ups after many commits only (the issue's targets)",
    )
    parser.add_argument(
        "--embeddings", type=Path, help="real embeddings (.npy) for the codec table"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="store_bench_", dir=args.dir))
    server = None
    try:
        print(f"load average {os.getloadavg()}, {os.cpu_count()} CPUs")
        vectors = embeddings_like(N, DIM)
        hashes = seq_hashes(N)
        print(f"{N} x {DIM} float32 = {vectors.nbytes / 1e6:.1f} MB")
        if args.quick:
            bench_local(work, vectors, hashes, extras=False)
            print("\nlook-ups after many commits:")
            bench_merged_lookups(work / "merged", args.records)
            return 0
        bench_local(work, vectors, hashes)
        endpoint = None
        if not args.no_s3:
            server, endpoint = start_moto()
            bench_s3(endpoint, vectors, hashes)
        print("\ncommit latency:")
        bench_commits(work / "commits", None)
        if endpoint:
            bench_commits(*s3_location(endpoint))
        print("\nlisting cost:")
        t_write = write_records(work / "records", args.records)
        per = t_write / args.records * 4e3
        print(
            f"  {args.records:,} one-row commits by 4 local writers: {per:.1f} ms each"
        )
        if endpoint:
            url, options = s3_location(endpoint)
            copy_store(work / "records", url, options)
            bench_records("S3", url, options, args.records)
        bench_records("local", work / "records", None, args.records)
        bench_merged_lookups(work / "merged", args.records)
        body = np.frombuffer(vectors.tobytes(), np.uint8)
        t_crc = best(lambda: google_crc32c.value(body))
        t_sha = best(lambda: hashlib.sha256(body).digest(), 3)
        mb = vectors.nbytes / 1e6
        print("\nchecksums over all 84 MB (reads check crc32c; commits record sha256):")
        print(
            f"  crc32c {t_crc:.4f} s ({mb / t_crc:,.0f} MB/s)   "
            f"sha256 {t_sha:.4f} s ({mb / t_sha:,.0f} MB/s)"
        )
        codec_table("embeddings_like (synthetic)", vectors[:8192])
        if args.embeddings is not None:
            real = np.load(args.embeddings).astype(np.float32)
            codec_table(f"real embeddings {args.embeddings.name}", real)
        print(f"\nload average {os.getloadavg()}")
    finally:
        if server is not None:
            server.terminate()
            server.wait()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
