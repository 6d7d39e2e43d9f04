"""How the store's costs grow with the rows of a key: fill, cold look-up, p99 under load.

1 M to 16 M rows (``--quick``: 100 k to 1.6 M) of 32 bp sequences under ``kmer-1``'s
key: a fill as ``embed`` does minus the model, cold ``embed`` look-ups (local, moto's
S3), and ``get``'s p99 while another thread commits, beside the floor another process
sets. Records the growth ratios, largest size over smallest, and the p99 ratios.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from subprocess import PIPE
from typing import TYPE_CHECKING

import numpy as np

from benchmarks.common import (
    bench_parser,
    child,
    clocks,
    cold_lookup,
    hwm_mib,
    machine_peaks,
    run_timed,
    show,
)
from benchmarks.records import Figure, record
from embedcache.data.seqfile import STREAM_ROWS as CHUNK  # `embed`'s chunk of a file

if TYPE_CHECKING:
    from collections.abc import Callable

MODEL = "kmer-1"
BATCH = 50_000  # rows per commit in the fill (kmer batches are large)
SEQ_BP = 32
N_KNOWN = 100
HERE = "benchmarks.scale_bench"  # its functions run afresh (common.child)


def fill(n: str, root: str, out_path: str) -> None:
    """In a fresh process (:func:`run_fill`): fill a new store with ``n`` rows as
    `embed` streams a file, a chunk at a time; print the times and peaks as JSON."""
    from embedcache.engine.memory import return_freed_memory
    from embedcache.engine.output import npy_rows
    from embedcache.models import load_adapter
    from embedcache.store import EmbeddingStore
    from embedcache.store.index import to_hex

    n, key = int(n), load_adapter(MODEL).key
    return_freed_memory()  # as `embed` sets it: freed temporaries go back at once
    base, total, phase = hwm_mib(), {}, defaultdict(dict)  # base: the imports only
    with clocks(total), npy_rows(out_path, (n, 4)) as out:
        store = EmbeddingStore(root)
        for lo in range(0, n, CHUNK):
            with clocks(phase["hash"]):
                digests = chunk_digests(lo, n)
            with clocks(phase["look-up"]):  # the plan's, in hash order
                order = np.sort(digests)
                for i in range(0, len(order), 100_000):
                    store.contains(key, to_hex(order[i : i + 100_000]))
                del order
            with clocks(phase["put"]):
                rng = np.random.default_rng(lo)
                for i in range(0, len(digests), BATCH):
                    hashes = to_hex(digests[i : i + BATCH])
                    vectors = rng.random((len(hashes), 4), dtype=np.float32)
                    store.put(key, hashes, vectors)
            with clocks(phase["read"]):
                vectors = np.empty((len(digests), 4), np.float32)
                assert store.read_into(key, digests, vectors).all()
                out.write(vectors)
                del vectors
    phase = {name: spent["wall"] for name, spent in phase.items()}
    print(json.dumps({"seconds": total["wall"], "cpu": total["cpu"], **phase,
                      "peak_mib": hwm_mib(), "base_mib": base,
                      "runs": store.keys()[0].n_runs}))  # fmt: skip


def chunk_digests(lo: int, n: int) -> np.ndarray:
    """Raw sha256 keys (S32) of sequences lo..lo+CHUNK, from their packed bases 100,000
    at a time, as `embed` hashes a file's chunk (engine/plan.py): no str per row."""
    from embedcache.hashing import sequence_digest

    raw = chunk_bases(lo, n)
    digests = np.empty(len(raw) // SEQ_BP, "S32")
    step = 100_000 * SEQ_BP
    for start in range(0, len(raw), step):
        part = raw[start : start + step]
        joined = b"".join(
            sequence_digest(part[i : i + SEQ_BP].decode())
            for i in range(0, len(part), SEQ_BP)
        )
        digests[start // SEQ_BP : (start + len(part)) // SEQ_BP] = np.frombuffer(
            joined, "S32"
        )
    return digests


def chunk_bases(lo: int, n: int) -> bytes:
    """The bases of sequences lo..lo+CHUNK, SEQ_BP each, back to back."""
    k = min(CHUNK, n - lo)
    rng = np.random.default_rng([lo, 7])
    codes = rng.integers(0, 4, (k, SEQ_BP), dtype=np.uint8)  # not 8 bytes a base
    return np.frombuffer(b"ACGT", np.uint8)[codes].tobytes()


def known_seqs(n: int) -> list[str]:
    """N_KNOWN stored sequences, spread over the key."""
    rows = np.random.default_rng(n).choice(n, N_KNOWN, replace=False)
    out = []
    for lo in sorted({int(r) // CHUNK * CHUNK for r in rows}):
        raw = chunk_bases(lo, n)
        picked = [r - lo for r in rows if lo <= r < lo + CHUNK]
        out += [raw[i * SEQ_BP : (i + 1) * SEQ_BP].decode() for i in picked]
    return out


class S3:
    """moto's S3 server on 127.0.0.1 in this process, counting the requests it gets."""

    def __init__(self) -> None:
        import logging

        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self.counts: Counter[str] = Counter()
        app = DomainDispatcherApplication(create_backend_app)

        def counting(environ: dict, start_response: object) -> object:
            self.counts[environ["REQUEST_METHOD"]] += 1
            return app(environ, start_response)

        self.server = make_server(
            "127.0.0.1", 0, counting, True, request_handler=MotoRequestHandler
        )
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.options = {
            **dict.fromkeys(("aws_access_key_id", "aws_secret_access_key"), "testing"),
            "aws_region": "us-east-1",
            "aws_endpoint_url": self.endpoint,
            "aws_allow_http": "true",
        }
        self.env = {**os.environ, **{k.upper(): v for k, v in self.options.items()}}

    def upload(self, folder: Path, bucket: str) -> str:
        """A copy of ``folder`` in a new bucket; the store's URL."""
        from concurrent.futures import ThreadPoolExecutor

        import boto3
        import obstore

        from embedcache.store import open_object_store

        creds = {k: v for k, v in self.options.items() if k.endswith(("_id", "_key"))}
        s3 = boto3.client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1", **creds
        )
        s3.create_bucket(Bucket=bucket)
        url = f"s3://{bucket}/store"
        raw = open_object_store(url, self.options)

        def put(path: Path) -> None:
            obstore.put(raw, path.relative_to(folder).as_posix(), path.read_bytes())

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(put, [p for p in folder.rglob("*") if p.is_file()]))
        return url


def run_fill(n: int, root: Path, workdir: Path) -> dict:
    """A fresh process's fill of ``n`` rows into a new store at ``root``."""
    output = workdir / f"out-{n}.npy"
    _, done = run_timed(child(HERE, "fill", n, root, output))
    output.unlink()
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(n: int, workdir: Path, s3: S3 | None) -> dict:
    root = workdir / f"store-{n}"
    fill = run_fill(n, root, workdir)
    known = workdir / f"known-{n}.txt"
    known.write_text("\n".join(known_seqs(n)) + "\n")
    rss = fill["peak_mib"]  # the child's own VmHWM
    row = {"n": n, "fill_s": fill["seconds"], "fill_us_row": fill["seconds"] / n * 1e6,
           "fill_cpu_us_row": fill["cpu"] / n * 1e6, "fill_rss": rss,
           "fill_extra": rss - fill["base_mib"], "out_mib": n * 16 / 2**20}  # fmt: skip
    row["local_s"], row["local_rss"] = cold_lookup(MODEL, str(root), known)
    ls = [sys.executable, "-m", "embedcache.cli", "store", "ls", "--store", str(root)]
    row["ls_s"], _ = run_timed(ls)
    if s3 is not None:
        url = s3.upload(root, f"scale-{n}")
        s3.counts.clear()
        row["s3_s"], row["s3_rss"] = cold_lookup(MODEL, url, known, s3.env)
        row["s3_requests"] = sum(s3.counts.values()) / 3
        row["s3_by_method"] = {k: v / 3 for k, v in sorted(s3.counts.items())}
    phases = {k: fill[k] for k in ("hash", "look-up", "put", "read", "runs")}
    show(f"{n:,} rows (seconds, us a row, MiB)", row | phases)
    return row


def p99_hashes(start: int, k: int) -> list[str]:
    return [
        hashlib.sha256(f"p{i}".encode()).hexdigest() for i in range(start, start + k)
    ]


def p99_job(n_job: int, batch: int) -> list[tuple[list[str], np.ndarray]]:
    """The job's keys and vectors, made untimed: a server's batcher hands put both."""
    rng = np.random.default_rng(1)
    return [
        (p99_hashes(lo, batch), rng.random((batch, 4), dtype=np.float32))
        for lo in range(10_000, 10_000 + n_job, batch)
    ]


def floor_writer(root: str, n_job: str, batch: str) -> None:
    """In a fresh process: the job through put into a store of its own, begun at the
    end of stdin once ready (the floor's writer: it shares only the machine)."""
    from embedcache.models import load_adapter
    from embedcache.store import EmbeddingStore

    key, store = load_adapter(MODEL).key, EmbeddingStore(root)
    work = p99_job(int(n_job), int(batch))
    print("ready", flush=True)
    sys.stdin.readline()
    for hashed, vectors in work:
        store.put(key, hashed, vectors)


def p99_under_commits(
    workdir: Path, *, writer: str = "thread", n_job: int = 100_000, batch: int = 2_000
) -> tuple[float, float]:
    """get's p99 of one stored hash (ms), idle and while a job commits from another
    thread into this store or (the floor) another process into another store."""
    from embedcache.models import load_adapter
    from embedcache.store import EmbeddingStore

    key = load_adapter(MODEL).key
    store = EmbeddingStore(workdir / "read")
    rng = np.random.default_rng(1)
    store.put(key, p99_hashes(0, 10_000), rng.random((10_000, 4), dtype=np.float32))
    one = p99_hashes(5, 1)

    def sample(running: Callable[[], bool], limit: int) -> np.ndarray:
        times = []
        while len(times) < limit and running():
            t = time.perf_counter()
            _, found = store.get(key, one)
            times.append(time.perf_counter() - t)
            assert found.all()
            time.sleep(0.001)  # a request rate, not a spin on the GIL
        return np.array(times)

    idle = sample(lambda: True, 2_000)
    if writer == "thread":
        work = p99_job(n_job, batch)
        thread = threading.Thread(target=lambda: [store.put(key, *w) for w in work])
        t0 = time.perf_counter()
        thread.start()
        busy = sample(thread.is_alive, 10**9)
        thread.join()
    else:
        cmd = child(HERE, "floor_writer", workdir / "other", n_job, batch)
        # it says "ready" once set up and begins at EOF: its start-up is not timed
        proc = subprocess.Popen(cmd, stdin=PIPE, stdout=PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        proc.stdin.close()
        t0 = time.perf_counter()
        busy = sample(lambda: proc.poll() is None, 10**9)
        assert proc.wait() == 0, "the floor's writer failed"
    job_s = time.perf_counter() - t0
    p_idle, p_busy = np.percentile(idle, 99) * 1e3, np.percentile(busy, 99) * 1e3
    show(
        f"get p99 of one stored hash (ms), {writer} committing {n_job:,} sequences",
        {"idle": p_idle, "busy": p_busy, "idle n": len(idle), "busy n": len(busy),
         "job s": job_s},
    )  # fmt: skip
    return p_idle, p_busy


def server_figure(workdir: Path) -> dict[str, Figure]:
    """The p99 figures, the thread's and the floor's alternating for two sittings;
    the median sitting's ratios (a p99 under load moves between sittings)."""
    ratios = []
    for i in range(2):
        idle, busy = p99_under_commits(workdir / f"thread-{i}", writer="thread")
        _, floor = p99_under_commits(workdir / f"process-{i}", writer="process")
        ratios.append((busy / idle, busy / floor))
    busy_idle, busy_floor = np.median(ratios, 0)
    return {
        "get p99 busy / idle": Figure(round(busy_idle, 2), "x", "<= 2"),
        "get p99 busy / floor's busy": Figure(round(busy_floor, 2), "x"),
    }


def growth(rows: list[dict], again: dict | None, s3: bool) -> dict[str, Figure]:
    """The targeted ratios, largest size over smallest; ``again``: the smallest filled
    again after the largest (the machine's speed drifts over a run)."""
    first, last = rows[0], rows[-1]

    def grew(key: str, target: str | None = None) -> Figure:
        return Figure(round(last[key] / first[key], 2), "x", target)

    figures = {
        "cold local look-up time": grew("local_s", "<= 1.5"),
        "cold local look-up RSS": grew("local_rss", "<= 1.2"),
    }
    if s3:
        figures["cold s3 look-up time"] = grew("s3_s", "<= 1.5")
        figures["cold s3 look-up RSS"] = grew("s3_rss", "<= 1.2")
        figures["cold s3 look-up requests"] = Figure(round(last["s3_requests"]))
    figures["fill time per row"] = grew("fill_us_row", "<= 1.2")
    if again is not None:
        ratio = last["fill_us_row"] / (again["seconds"] / first["n"] * 1e6)
        figures["fill per row vs again"] = Figure(round(ratio, 2), "x", "<= 1.2")
    # beside it, the CPU time (every thread): where the two part, the fill waited (on
    # the disk: its fsyncs, and writeback of a store no longer in memory)
    figures["fill CPU time per row"] = grew("fill_cpu_us_row")
    for r in rows:
        ratio = round(r["fill_extra"] / r["out_mib"], 2)
        figures[f"fill peak / output at {r['n']:,}"] = Figure(ratio, "x", "<= 2")
    # the output streams to a file: the other form of the target is a peak bounded by
    # the chunk, not growing with n (~1x)
    figures["fill peak over imports"] = grew("fill_extra")
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, "100 k to 1.6 M rows")
    parser.add_argument("--sizes", default=None)
    parser.add_argument("--no-s3", action="store_true")
    parser.add_argument("--no-p99", action="store_true")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)
    default = "100000,400000,1600000" if args.quick else "1000000,4000000,16000000"
    sizes = [int(x) for x in (args.sizes or default).split(",")]
    figures: dict[str, Figure] = {}
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        s3 = None if args.no_s3 else S3()
        rows = [measure(n, Path(tmp), s3) for n in sizes]
        again = None
        if len(rows) > 1:
            again = run_fill(rows[0]["n"], Path(tmp) / "again", Path(tmp))
        figures |= growth(rows, again, s3 is not None)
        if not args.no_p99:
            figures |= server_figure(Path(tmp) / "p99")
    record("scale_bench", figures, quick=args.quick, peaks=machine_peaks(), argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
