"""`embedcache serve` against infinity (infinity-emb 0.0.78), side by side in one run.

Both serve the same weights: a 256-wide 4-layer BERT, one token per base, random
init, saved with ``save_pretrained`` (benchmarks/shapes.py), fp32 on the CPU, each
with its defaults otherwise. The load is the same for both: ``--clients`` (16)
concurrent clients sending requests of 32 sequences of 200-500 bp to the
OpenAI-compatible route (``POST /v1/embeddings`` and infinity's ``POST
/embeddings``), float JSON answers.

- misses: new sequences, in ``--rounds`` rounds of ``--n`` sequences, the two servers
  taking turns (the first of a round goes second in the next), so a change in the
  machine's load falls on both;
- repeat: the same sequences again (embedcache answers them from its store; infinity
  computes them again), and through embedcache's binary route (``POST /v1/embed``,
  Arrow, as the Python client asks).

Printed: sequences/s of each and the ratios embedcache / infinity, with the load
average. infinity runs from its own virtual environment, made on first use under
``--cache`` (reused after): ``pip install "infinity-emb[server,torch]==0.0.78"
torch==2.13.0``; the project's environment is never touched. transformers 4.57 (which
infinity brings) does not know the tokenizer class transformers 5 saves, so
infinity reads a copy of the folder whose ``tokenizer_config.json`` names
``PreTrainedTokenizerFast`` (same weights, same vocabulary).

Run: ``.venv/bin/python benchmarks/peer_bench.py [--n 512] [--rounds 2]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.serve_bench import free_port, load
from benchmarks.shapes import SHAPES
from embedcache.service import wire

REPO = Path(__file__).resolve().parents[1]
INFINITY = "infinity-emb[server,torch]==0.0.78"
TORCH = "torch==2.13.0"
PER_REQUEST = 32


def infinity_env(cache: Path) -> Path:
    """The scratch venv holding infinity (made once; a marker says it is complete)."""
    venv = cache / "infinity-emb-0.0.78"
    marker = venv / ".complete"
    if not marker.exists():
        print(f"installing {INFINITY} into {venv} (once)", flush=True)
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                INFINITY,
                TORCH,
            ],
            check=True,
        )
        marker.touch()
    return venv


def infinity_model(model_dir: Path, work: Path) -> Path:
    """A copy of the model folder whose tokenizer transformers 4.57 can load."""
    copy = work / "model-infinity"
    shutil.copytree(model_dir, copy)
    config_path = copy / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2))
    return copy


class Peer:
    """A server process, its OpenAI route and the model name it answers to."""

    def __init__(
        self, name: str, args: list[str], route: str, model: str, log: Path, env: dict
    ) -> None:
        self.name, self.route, self.model = name, route, model
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log.open("w")
        self.log = log
        self.proc = subprocess.Popen(
            [*args, "--port", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )

    def wait_ready(self, ready_route: str) -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"{self.name} exited:\n{self.log.read_text()[-4000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + ready_route, timeout=1).status_code == 200:
                    return
            time.sleep(0.5)
        sys.exit(f"{self.name} not ready after 600 s")

    def stop(self) -> int:
        self.proc.terminate()
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
        finally:
            self._log.close()


def drive(
    peer: Peer, seqs: list[str], clients: int, *, route: str | None = None
) -> float:
    """Seconds for ``clients`` threads to send ``seqs`` in requests of 32 (each
    request taken from one shared queue as a client comes free)."""
    todo: queue.Queue[list[str]] = queue.Queue()
    for i in range(0, len(seqs), PER_REQUEST):
        todo.put(seqs[i : i + PER_REQUEST])
    errors: list[str] = []
    binary = route == wire.ROUTE_EMBED

    def client() -> None:
        with httpx.Client(base_url=peer.url, timeout=600) as http:
            while True:
                try:
                    chunk = todo.get_nowait()
                except queue.Empty:
                    return
                if binary:
                    reply = http.post(
                        wire.ROUTE_EMBED,
                        json={"model": peer.model, "sequences": chunk},
                        headers={"Accept": wire.MEDIA_ARROW},
                    )
                else:
                    reply = http.post(
                        peer.route, json={"model": peer.model, "input": chunk}
                    )
                if reply.status_code != 200:
                    errors.append(f"{reply.status_code} {reply.text[:200]}")
                    return
                if not binary:
                    data = reply.json()["data"]
                    assert len(data) == len(chunk)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    if errors:
        sys.exit(f"{peer.name}: {len(errors)} failed requests, first: {errors[0]}")
    return seconds


def new_seqs(n: int, rng: np.random.Generator) -> list[str]:
    return [
        "".join(rng.choice(list("ACGT"), size=int(rng.integers(200, 501))))
        for _ in range(n)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=512, help="sequences a round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        / "embedcache-bench",
        help="where infinity's venv is made once and reused",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    venv = infinity_env(args.cache)
    work = Path(tempfile.mkdtemp(prefix="peer-bench-"))
    peers: list[Peer] = []
    try:
        model_dir = work / "model"
        SHAPES["bert-char-256x4"].build(model_dir)
        env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
        ours = Peer(
            "embedcache",
            [
                *(sys.executable, "-m", "embedcache.cli", "serve"),
                *("--store", str(work / "store"), "--model", f"bench={model_dir}"),
                *("--device", "cpu", "--max-sequences", "10000"),
            ],
            wire.ROUTE_EMBEDDINGS,
            "bench",
            work / "embedcache.log",
            env,
        )
        peers.append(ours)
        theirs = Peer(
            "infinity",
            [
                str(venv / "bin" / "infinity_emb"),
                *("v2", "--model-id", str(infinity_model(model_dir, work))),
                *("--served-model-name", "bench", "--engine", "torch"),
                *("--device", "cpu", "--pooling-method", "mean", "--host", "127.0.0.1"),
                *("--dtype", "float32", "--no-bettertransformer"),
            ],
            "/embeddings",
            "bench",
            work / "infinity.log",
            {k: v for k, v in env.items() if k != "PYTHONPATH"},
        )
        peers.append(theirs)
        ours.wait_ready(wire.ROUTE_READY)
        theirs.wait_ready("/health")
        rng = np.random.default_rng(args.seed)
        warm = new_seqs(2 * PER_REQUEST, rng)
        for peer in peers:  # first allocations, both
            drive(peer, warm, 2)
        print(
            f"model: bert-char-256x4 ({SHAPES['bert-char-256x4'].about}), random init, "
            f"fp32, CPU; {args.clients} clients x {PER_REQUEST}-sequence requests of "
            f"200-500 bp, {args.rounds} rounds of {args.n}; load {load()}",
            flush=True,
        )
        seconds = {"embedcache": 0.0, "infinity": 0.0}
        repeat = {"embedcache": 0.0, "infinity": 0.0, "binary": 0.0}
        n_total = 0
        for r in range(args.rounds):
            seqs = new_seqs(args.n, rng)
            n_total += len(seqs)
            order = peers if r % 2 == 0 else peers[::-1]
            took = {peer.name: drive(peer, seqs, args.clients) for peer in order}
            print(f"round {r + 1} misses, sequences/s: ", end="")
            print(*(f"{k} {len(seqs) / v:.1f}" for k, v in took.items()), end="")
            print(f"; load {load()}", flush=True)
            for name, value in took.items():
                seconds[name] += value
            for peer in order:
                repeat[peer.name] += drive(peer, seqs, args.clients)
            repeat["binary"] += drive(ours, seqs, args.clients, route=wire.ROUTE_EMBED)
            print(f"round {r + 1} repeats done, load {load()}", flush=True)
        rate = {name: n_total / s for name, s in seconds.items()}
        again = {name: n_total / s for name, s in repeat.items()}
        rows = [
            ("misses: sequences/s", rate["embedcache"], rate["infinity"], "(>= 1.2x)"),
            ("repeat: sequences/s", again["embedcache"], again["infinity"], ""),
            ("repeat, embedcache's binary route (Arrow)", again["binary"], again["infinity"], ""),
        ]  # fmt: skip
        print(
            f"\n{'figure':<44} {'embedcache':>11} {'infinity':>9}  embedcache / infinity"
        )
        for name, a, b, note in rows:
            print(f"{name:<44} {a:>11.1f} {b:>9.1f}  {a / b:.2f}x {note}")
        print(f"load at the end {load()}")
    finally:
        for peer in peers:
            peer.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
