"""How the store's costs grow with the rows of a key: fill, cold look-up, p99 under load.

For each size (1 M, 4 M and 16 M rows; ``--quick``: 100 k, 400 k, 1.6 M): ``fill``, a
fresh process fills a new store with random 32 bp sequences under ``kmer-1``'s key as
``embed`` does minus the model (hash, look up in hash order, ``put`` in batches with
auto-merge, read back in input order into the output), with its wall and CPU time per
row and peak RSS; ``cold local``, a fresh ``embedcache embed`` of 100 stored sequences
(median of 3); ``store ls``; ``cold s3``, the same against moto's S3 server holding a
copy, with its HTTP requests counted. Then the ratios the issue targets, largest size
over smallest (the smallest is filled again after the largest: the machine drifts).

Last, the server figure: in one process, the p99 of ``get`` of one stored hash idle
and while another thread commits a 100,000-sequence job (target: within 2x idle); and
beside it, alternating, the floor: the same reader while another process commits into
another store, sharing only the machine.
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
from collections import Counter
from pathlib import Path
from subprocess import PIPE
from typing import TYPE_CHECKING

import numpy as np

from benchmarks.common import (
    REPO,
    bench_parser,
    cold_lookup,
    machine_peaks,
    run_measured,
    show,
)
from benchmarks.records import Figure, record

if TYPE_CHECKING:
    from collections.abc import Callable

MODEL = "kmer-1"
BATCH = 50_000  # rows per commit in the fill (kmer batches are large)
CHUNK = 1 << 20  # sequences a fill takes at a time: `embed`'s STREAM_ROWS
SEQ_BP = 32
N_KNOWN = 100

FILL = r"""
import json, os, sys, time
import numpy as np
sys.path.insert(0, sys.argv[4])
from benchmarks.scale_bench import CHUNK, chunk_digests
from embedcache.data.seqfile import STREAM_ROWS
from embedcache.engine.output import npy_rows
from embedcache.models import load_adapter
from embedcache.store import EmbeddingStore
from embedcache.store.index import to_hex
assert CHUNK == STREAM_ROWS
n, root, batch, out_path = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[5]
key = load_adapter("kmer-1").key
# as `embed` sets it for a floor (engine/api.py): freed temporaries go back at once
from embedcache.engine.memory import return_freed_memory
return_freed_memory()
from benchmarks.common import hwm_mib
base = hwm_mib()  # imports only
phase = dict.fromkeys(("hash", "look-up", "put", "read"), 0.0)
t0 = time.perf_counter()
cpu0 = sum(os.times()[:2])  # user + system, every thread of this process
store = EmbeddingStore(root)
with npy_rows(out_path, (n, 4)) as out:
    # as `embed` streams a file of several chunks (engine/api.py), a chunk at a time
    for lo in range(0, n, CHUNK):
        t = time.perf_counter()
        digests = chunk_digests(lo, n)
        phase["hash"] += time.perf_counter() - t
        t = time.perf_counter()
        order = np.sort(digests)  # the plan's look-up, in hash order
        for i in range(0, len(order), 100_000):
            store.contains(key, to_hex(order[i : i + 100_000]))
        del order
        phase["look-up"] += time.perf_counter() - t
        t = time.perf_counter()
        rng = np.random.default_rng(lo)
        for i in range(0, len(digests), batch):
            hashes = to_hex(digests[i : i + batch])
            store.put(key, hashes, rng.random((len(hashes), 4), dtype=np.float32))
        phase["put"] += time.perf_counter() - t
        t = time.perf_counter()
        vectors = np.empty((len(digests), 4), np.float32)
        assert store.read_into(key, digests, vectors).all()
        out.write(vectors)
        del vectors
        phase["read"] += time.perf_counter() - t
seconds = time.perf_counter() - t0
cpu = sum(os.times()[:2]) - cpu0
peak = hwm_mib()
shards = store.keys()[0].n_runs
print(json.dumps({"seconds": seconds, "cpu": cpu, **phase,
                  "peak_mib": peak, "base_mib": base, "shards": shards}))
"""


def chunk_digests(lo: int, n: int) -> np.ndarray:
    """Raw sha256 keys of sequences lo..lo+CHUNK (seeded by lo): (k,) S32.

    Held as `embed` holds a chunk of a file: the bases packed (~1 byte each), hashed
    100,000 at a time (engine/plan.py), never a Python string per row.
    """
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


def chunk_seqs(lo: int, n: int) -> list[str]:
    raw = chunk_bases(lo, n)
    return [raw[i : i + SEQ_BP].decode() for i in range(0, len(raw), SEQ_BP)]


def known_seqs(n: int) -> list[str]:
    """N_KNOWN stored sequences, spread over the key."""
    rows = np.random.default_rng(n).choice(n, N_KNOWN, replace=False)
    out = []
    for lo in sorted({int(r) // CHUNK * CHUNK for r in rows}):
        seqs = chunk_seqs(lo, n)
        out += [seqs[r - lo] for r in rows if lo <= r < lo + CHUNK]
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
    here = str(REPO)
    output = workdir / f"out-{n}.npy"
    _, _, out = run_measured(
        [sys.executable, "-c", FILL, str(n), str(root), str(BATCH), here, str(output)]
    )
    output.unlink()
    return json.loads(out.strip().splitlines()[-1])


def measure(n: int, workdir: Path, s3: S3 | None) -> dict:
    root = workdir / f"store-{n}"
    fill = run_fill(n, root, workdir)
    # the child's own VmHWM: ru_maxrss of a forked child starts at its parent's size
    fill_rss = fill["peak_mib"]
    known = workdir / f"known-{n}.txt"
    known.write_text("\n".join(known_seqs(n)) + "\n")
    out_mib = n * 4 * 4 / 2**20
    row = {"n": n, "fill_s": fill["seconds"], "fill_us_row": fill["seconds"] / n * 1e6,
           "fill_cpu_us_row": fill["cpu"] / n * 1e6, "fill_rss": fill_rss,
           "fill_extra": fill_rss - fill["base_mib"], "out_mib": out_mib}  # fmt: skip
    row["local_s"], row["local_rss"] = cold_lookup(MODEL, str(root), known)
    ls = [sys.executable, "-m", "embedcache.cli", "store", "ls", "--store", str(root)]
    row["ls_s"], _, _ = run_measured(ls)
    if s3 is not None:
        url = s3.upload(root, f"scale-{n}")
        s3.counts.clear()
        row["s3_s"], row["s3_rss"] = cold_lookup(MODEL, url, known, s3.env)
        row["s3_requests"] = sum(s3.counts.values()) / 3
        row["s3_by_method"] = {k: v / 3 for k, v in sorted(s3.counts.items())}
    phases = {k: fill[k] for k in ("hash", "look-up", "put", "read", "shards")}
    show(f"{n:,} rows (seconds, us a row, MiB)", row | phases)
    return row


def p99_hashes(start: int, k: int) -> list[str]:
    return [
        hashlib.sha256(f"p{i}".encode()).hexdigest() for i in range(start, start + k)
    ]


def p99_job(n_job: int, batch: int) -> list[tuple[list[str], np.ndarray]]:
    """The job's sequence keys and vectors, made before anything is timed: what is
    timed beside the reads is put's work (a server's batcher hands it hashes it
    already has)."""
    rng = np.random.default_rng(1)
    return [
        (p99_hashes(lo, batch), rng.random((batch, 4), dtype=np.float32))
        for lo in range(10_000, 10_000 + n_job, batch)
    ]


# the floor's writer: the same job through put into a store of its own, in a
# process of its own, sharing nothing with the reader but the machine
FLOOR_WRITER = r"""
import sys
sys.path.insert(0, sys.argv[1])
from benchmarks.scale_bench import MODEL, p99_job
from embedcache.models import load_adapter
from embedcache.store import EmbeddingStore
key = load_adapter(MODEL).key
store = EmbeddingStore(sys.argv[2])
work = p99_job(int(sys.argv[3]), int(sys.argv[4]))
print("ready", flush=True)
sys.stdin.readline()
for hashed, vectors in work:
    store.put(key, hashed, vectors)
"""


def p99_under_commits(
    workdir: Path, *, writer: str = "thread", n_job: int = 100_000, batch: int = 2_000
) -> tuple[float, float]:
    """In-process get p99 of one stored hash (ms): idle, and while a job commits.

    ``writer="thread"``: another thread of this process commits the job into the
    same store (the target's figure). ``writer="process"``: another process commits
    it into another store, so the reader shares only the machine with it: the
    floor this machine sets on the figure.
    """
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
        done = threading.Event()

        def job() -> None:
            for hashed, vectors in work:
                store.put(key, hashed, vectors)
            done.set()

        t0 = time.perf_counter()
        thread = threading.Thread(target=job)
        thread.start()
        busy = sample(lambda: not done.is_set(), 10**9)
        thread.join()
    else:
        cmd = [sys.executable, "-c", FLOOR_WRITER, str(REPO)]
        cmd += [str(workdir / "other"), str(n_job), str(batch)]
        # it prints "ready" once set up and waits for a line to begin: what is timed
        # beside it is its work, not its start-up
        proc = subprocess.Popen(cmd, stdin=PIPE, stdout=PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        proc.stdin.write("go\n")
        proc.stdin.flush()
        t0 = time.perf_counter()
        busy = sample(lambda: proc.poll() is None, 10**9)
        if proc.wait():
            msg = f"the floor's writer failed ({proc.returncode})"
            raise RuntimeError(msg)
    job_s = time.perf_counter() - t0
    p_idle, p_busy = np.percentile(idle, 99) * 1e3, np.percentile(busy, 99) * 1e3
    show(
        f"get p99 of one stored hash (ms), {writer} committing {n_job:,} sequences",
        {"idle": p_idle, "busy": p_busy, "idle n": len(idle), "busy n": len(busy),
         "job s": job_s},
    )  # fmt: skip
    return p_idle, p_busy


def server_figure(workdir: Path, sittings: int) -> list[tuple[float, float, float]]:
    """The server figure, and beside it (alternating, one sitting each at a time)
    the floor: the same reader while a writer shares nothing with it but the
    machine. The store's own share is the first busy p99 over the second.
    (idle, busy, floor's busy) p99 ms per sitting."""
    out = []
    for i in range(sittings):
        idle, busy = p99_under_commits(workdir / f"thread-{i}", writer="thread")
        _, floor = p99_under_commits(workdir / f"process-{i}", writer="process")
        out.append((idle, busy, floor))
    return out


def growth(rows: list[dict], again: dict | None, s3: bool) -> dict[str, Figure]:
    """The ratios the issue targets, largest size over smallest; ``again``: the
    smallest filled again after the largest (the machine's speed drifts over a run,
    and a ratio on one slow stretch flatters)."""
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
        us_again = again["seconds"] / first["n"] * 1e6
        ratio = last["fill_us_row"] / us_again
        figures["fill per row vs again"] = Figure(round(ratio, 2), "x", "<= 1.2")
    # beside it, the CPU time (every thread): where the two part, the fill waited (on
    # the disk: its fsyncs, and writeback of a store no longer in memory)
    figures["fill CPU time per row"] = grew("fill_cpu_us_row")
    for r in rows:
        ratio = r["fill_extra"] / r["out_mib"]
        figures[f"fill peak / output at {r['n']:,}"] = Figure(
            round(ratio, 2), "x", "<= 2"
        )
    # the output streams to a file: the other form of the target is a peak bounded by
    # the chunk, not growing with n (~1x)
    figures["fill peak over imports"] = grew("fill_extra")
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, "100 k to 1.6 M rows")
    parser.add_argument("--sizes", default=None)
    parser.add_argument("--no-s3", action="store_true")
    parser.add_argument("--no-p99", action="store_true")
    parser.add_argument("--p99-only", action="store_true", help="three sittings")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)
    default = "100000,400000,1600000" if args.quick else "1000000,4000000,16000000"
    sizes = [int(x) for x in (args.sizes or default).split(",")]
    figures: dict[str, Figure] = {}
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        s3 = None if args.no_s3 or args.p99_only else S3()
        rows = [] if args.p99_only else [measure(n, Path(tmp), s3) for n in sizes]
        if rows:
            again = None
            if len(rows) > 1:
                again = run_fill(rows[0]["n"], Path(tmp) / "again", Path(tmp))
            figures |= growth(rows, again, s3 is not None)
        if not args.no_p99:
            sittings = server_figure(Path(tmp) / "p99", 3 if args.p99_only else 2)
            # the median sitting: a p99 under load moves between sittings
            busy_idle, busy_floor = np.median(
                [(b / i, b / f) for i, b, f in sittings], 0
            )
            figures["get p99 busy / idle"] = Figure(round(busy_idle, 2), "x", "<= 2")
            figures["get p99 busy / floor's busy"] = Figure(round(busy_floor, 2), "x")
    record("scale_bench", figures, quick=args.quick, peaks=machine_peaks(), argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
