"""Embedding on Dask: real worker processes, a real store, no mocks."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

from embedcache.cli import main
from embedcache.data.subsets import draw_version
from embedcache.data.versions import load_version
from embedcache.engine.api import embed_into_store
from embedcache.engine.batching import BatchRule
from embedcache.engine.cluster import embed_on_cluster, run_units
from embedcache.engine.dask_setup import open_cluster, parse_cluster
from embedcache.engine.local import embed_sequences
from embedcache.engine.plan import cut_units, plan_embedding
from embedcache.engine.unit_queue import (
    FLOOR_UNIT_SECONDS,
    MAX_UNIT_TOKENS,
    MIN_UNIT_TOKENS,
    TARGET_UNIT_SECONDS,
    UnitQueue,
    next_unit_tokens,
)
from embedcache.engine.worker import StoreRef, resolve_spec
from embedcache.errors import (
    ClusterError,
    DeviceUnavailableError,
    InvalidSequenceError,
    StoreError,
)
from embedcache.hashing import sequence_key
from embedcache.models import load_adapter
from embedcache.store import EmbeddingStore
from tests.conftest import save_tiny_bert
from tests.engine.helpers import write_small_version

REPO = Path(__file__).resolve().parents[2]


def subprocess_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), env.get("PYTHONPATH")) if p
    )
    return env


@pytest.fixture(scope="module")
def client():
    """A LocalCluster of two worker processes, one thread each."""
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        yield c


@pytest.fixture(scope="module")
def bert512(tmp_path_factory):
    """The tiny BERT with room for demo-v1's 500 bp sequences."""
    return save_tiny_bert(
        tmp_path_factory.mktemp("bert512"), max_position_embeddings=512
    )


@pytest.fixture(scope="module")
def demo_items():
    return draw_version(load_version("demo-v1")).items


@pytest.fixture(scope="module")
def small_version(tmp_path_factory):
    """demo-v1's datasets drawn smaller (20 train + 30 test each): a tiny BERT's share."""
    return write_small_version(tmp_path_factory.mktemp("versions") / "small-demo.toml")


def n_stored(store_path):
    """Vectors committed so far (0 before the store exists), whatever the layout."""
    try:
        infos = EmbeddingStore(store_path, create=False).keys()
    except StoreError:
        return 0
    return sum(info.n_vectors for info in infos)


def stored(store_path, key, seqs):
    vectors, found = EmbeddingStore(store_path, create=False).get(
        key, [sequence_key(s) for s in seqs]
    )
    assert found.all()
    return vectors


# --- planning, pure -----------------------------------------------------------------


def test_parse_cluster_specs():
    assert parse_cluster("local:3") == ("local", 3)
    assert parse_cluster("tcp://10.0.0.1:8786") == ("address", "tcp://10.0.0.1:8786")
    for bad in ("local", "local:0", "local:x", "10.0.0.1:8786", "tcp://"):
        with pytest.raises(ClusterError, match="neither local:N"):
            parse_cluster(bad)


def test_unit_size_follows_the_measured_rate_within_bounds():
    rate, workers = 10_000, 4
    assert next_unit_tokens(None, 10**9, workers) == MIN_UNIT_TOKENS  # not measured
    assert next_unit_tokens(rate, 10**9, workers) == rate * TARGET_UNIT_SECONDS
    assert next_unit_tokens(10**7, 10**12, workers) == MAX_UNIT_TOKENS
    assert next_unit_tokens(10, 10**9, workers) == MIN_UNIT_TOKENS
    # near the end: half a worker's share of what is left, but not under the floor
    middle = rate * (TARGET_UNIT_SECONDS + FLOOR_UNIT_SECONDS) / 2
    assert next_unit_tokens(rate, int(middle * 2 * workers), workers) == middle
    assert next_unit_tokens(rate, rate, workers) == rate * FLOOR_UNIT_SECONDS


def test_units_are_the_in_process_batches_regrouped(tiny_bert_dir, tmp_path):
    adapter = load_adapter(str(tiny_bert_dir), device="cpu")
    rng = np.random.default_rng(3)
    seqs = [
        "".join(rng.choice(list("ACGT"), size=rng.integers(5, 40))) for _ in range(80)
    ]
    plan = plan_embedding(adapter, seqs, EmbeddingStore(tmp_path / "s"))
    one_each = cut_units(plan, rule=BatchRule(200), unit_tokens=1)
    grouped = cut_units(plan, rule=BatchRule(200), unit_tokens=500)
    assert len(grouped) < len(one_each)
    batches = [[u.hashes[i] for i in b] for u in one_each for b in u.batches]
    regrouped = [[u.hashes[i] for i in b] for u in grouped for b in u.batches]
    assert regrouped == batches  # the same forward passes, only grouped differently
    assert sorted(h for u in grouped for h in u.hashes) == sorted(plan.missing_hashes)
    assert all(u.n_tokens >= 500 for u in grouped[:-1])
    # the cluster's queue: the same batches, longest sequences first, cut on demand
    queue = UnitQueue.from_plan(plan, rule=BatchRule(200), unit_tokens=500)
    handed = []
    while queue:
        handed.append(queue.next_unit(tokens_per_s=None, n_workers=2))
    assert queue.remaining_tokens == 0
    assert [[u.hashes[i] for i in b] for u in handed for b in u.batches] == batches[
        ::-1
    ]
    assert all(u.n_tokens >= 500 for u in handed[:-1])
    assert max(handed[0].tokens) == max(plan.missing_tokens)


# --- a LocalCluster of two worker processes -----------------------------------------


def test_local_cluster_equals_in_process_with_a_plain_writer_alongside(
    client, bert512, demo_items, small_version, tmp_path
):
    shared, alone = tmp_path / "shared", tmp_path / "alone"
    kmer_seqs = demo_items["seq"].to_list()
    kmer = load_adapter("kmer-4")
    # a plain process writes the same key into the same store while the cluster runs
    plain = threading.Thread(
        target=embed_sequences, args=(kmer, kmer_seqs, EmbeddingStore(shared))
    )
    plain.start()
    on_cluster = embed_on_cluster(client, "kmer-4", kmer_seqs, shared)
    plain.join()
    in_process = embed_sequences(kmer, kmer_seqs, EmbeddingStore(alone))
    assert (on_cluster.n_computed, on_cluster.n_cached) == (2400, 0)
    np.testing.assert_array_equal(on_cluster.vectors, in_process.vectors)

    bert_seqs = draw_version(load_version(small_version)).items["seq"].to_list()
    options = {"device": "cpu"}
    on_cluster = embed_on_cluster(
        client, str(bert512), bert_seqs, shared, options=options, unit_tokens=3000
    )
    bert = load_adapter(str(bert512), **options)
    in_process = embed_sequences(bert, bert_seqs, EmbeddingStore(alone))
    assert (on_cluster.n_computed, on_cluster.n_cached) == (
        in_process.n_computed,
        in_process.n_cached,
    )
    # fp32, the same length-sorted batches: the same floats, bit for bit
    np.testing.assert_array_equal(on_cluster.vectors, in_process.vectors)
    np.testing.assert_array_equal(
        stored(shared, bert.key, bert_seqs), in_process.vectors
    )

    store = EmbeddingStore(shared)
    assert store.verify() == []
    infos = store.keys()
    assert sorted(info.n_vectors for info in infos) == [100, 2400]
    again = embed_on_cluster(client, "kmer-4", kmer_seqs, shared)
    assert (again.n_computed, again.n_cached) == (0, 2400)


def test_the_one_call_takes_a_client_or_a_local_spec(client, demo_items, tmp_path):
    seqs = demo_items["seq"].to_list()[:300]
    in_process = embed_into_store("kmer-2", seqs, tmp_path / "here")
    via_client = embed_into_store("kmer-2", seqs, tmp_path / "client", cluster=client)
    assert (via_client.n_computed, via_client.n_cached) == (300, 0)
    assert via_client.keys == in_process.keys
    np.testing.assert_array_equal(via_client.vectors, in_process.vectors)
    with pytest.raises(ClusterError, match="threads do not apply to a running"):
        embed_into_store("kmer-2", seqs, tmp_path / "client", cluster=client, threads=2)
    # local:1 starts a worker process for this call and stops it after
    started = embed_into_store(
        "kmer-2", seqs, tmp_path / "local", cluster="local:1", threads=1
    )
    np.testing.assert_array_equal(started.vectors, in_process.vectors)
    assert EmbeddingStore(tmp_path / "local").verify() == []


def test_cli_on_a_running_cluster_prints_what_in_process_prints(
    client, small_version, tmp_path, capsys, caplog, monkeypatch
):
    caplog.set_level(logging.INFO, logger="embedcache")
    args = ["embeddings", "--model", "kmer-3", "--version", str(small_version)]
    assert main([*args, "--store", str(tmp_path / "a")]) == 0
    in_process = capsys.readouterr().out
    assert not [r for r in caplog.records if r.name == "embedcache.engine.cluster"]
    # the default comes from EMBEDCACHE_CLUSTER
    monkeypatch.setenv("EMBEDCACHE_CLUSTER", client.scheduler.address)
    assert main([*args, "--store", str(tmp_path / "b")]) == 0
    assert capsys.readouterr().out == in_process
    assert in_process.strip().splitlines()[-1] == "computed=100 cached=0"
    ran = [
        r.getMessage() for r in caplog.records if r.name == "embedcache.engine.cluster"
    ]
    assert any(client.scheduler.address in message for message in ran)
    assert client.submit(sum, [1, 2]).result() == 3  # the cluster is left running
    # --cluster none overrides the variable: in this process
    caplog.clear()
    assert main([*args, "--store", str(tmp_path / "c"), "--cluster", "none"]) == 0
    assert capsys.readouterr().out == in_process
    assert not [r for r in caplog.records if r.name == "embedcache.engine.cluster"]


def test_model_that_fails_to_load_on_workers_fails_once(
    client, tiny_bert_dir, tmp_path, capfd
):
    if _cuda():
        pytest.skip("CUDA is present here: a cuda device loads")
    seqs = ["ACGTACGT", "GGGCCCAA", "TTTTACGA"]
    (tmp_path / "in.txt").write_text("\n".join(seqs) + "\n")
    args = ["embed", "--model", str(tiny_bert_dir), "--input", str(tmp_path / "in.txt")]
    args += ["--output", str(tmp_path / "o.npy"), "--store", str(tmp_path / "s")]
    # the client plans on its CPU; the workers are asked for a GPU they lack
    args += ["--device", "cuda", "--cluster", client.scheduler.address]
    args += ["--unit-tokens", "10"]  # three units, on both workers
    assert main(args) == 2
    err = capfd.readouterr().err
    errors = [
        line for line in err.splitlines() if line.startswith("embedcache: error:")
    ]
    assert len(errors) == 1, err
    assert "CUDA is not available" in errors[0]
    assert "on worker tcp://" in err
    assert "Traceback" not in err
    assert not (tmp_path / "o.npy").exists()
    with pytest.raises(DeviceUnavailableError, match="CUDA is not available"):
        embed_on_cluster(
            client, str(tiny_bert_dir), seqs, tmp_path / "s", options={"device": "cuda"}
        )


def _cuda():
    import torch

    return torch.cuda.is_available()


def test_worker_that_cannot_open_the_store_says_it_must_be_shared(client, tmp_path):
    spec = resolve_spec("kmer-2")
    adapter = spec.load()
    plan = plan_embedding(adapter, ["ACGT", "GATTACA"], EmbeddingStore(tmp_path / "s"))
    units = cut_units(plan, rule=BatchRule(100), unit_tokens=100)
    missing = StoreRef(str(tmp_path / "not-mounted-here"))
    with pytest.raises(
        StoreError, match="reachable at the same location by every worker"
    ):
        run_units(client, spec, missing, plan.keys, units)
    with pytest.raises(StoreError, match="workers cannot reach it"):
        embed_on_cluster(client, "kmer-2", ["ACGT"], "memory://")


def test_non_finite_vectors_fail_the_run_once_naming_the_sequence(client, tmp_path):
    from tests.conftest import save_tiny_bert as save

    model = save(tmp_path / "nan-bert")
    weights = model / "model.safetensors"
    from safetensors.numpy import load_file, save_file

    tensors = load_file(weights)
    name = next(k for k in tensors if k.endswith("word_embeddings.weight"))
    tensors[name][:] = np.nan
    save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.raises(InvalidSequenceError, match="non-finite vector"):
        embed_on_cluster(
            client,
            str(model),
            ["ACGT", "GGCA"],
            tmp_path / "s",
            options={"device": "cpu"},
        )
    assert EmbeddingStore(tmp_path / "s").keys() == []


def test_unreachable_scheduler_is_a_clear_error():
    with (
        pytest.raises(ClusterError, match="cannot reach a Dask scheduler"),
        open_cluster("tcp://127.0.0.1:9", timeout=1),
    ):
        pass
    with (
        pytest.raises(ClusterError, match="--threads does not apply"),
        open_cluster("tcp://127.0.0.1:9", threads_per_worker=2),
    ):
        pass


# --- `dask scheduler` and `dask worker` in subprocesses ------------------------------


@pytest.fixture
def dask_cli_cluster(tmp_path):
    """A scheduler and two nanny-supervised workers started with the dask command."""
    dask = Path(sys.executable).with_name("dask")
    if not dask.exists():
        pytest.skip(f"no dask command beside {sys.executable}")
    env = subprocess_env()
    file = tmp_path / "scheduler.json"
    procs = [
        subprocess.Popen(
            [
                str(dask),
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--no-dashboard",
                "--scheduler-file",
                str(file),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    ]
    try:
        deadline = time.monotonic() + 60
        while not file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        address = json.loads(file.read_text())["address"]
        for name in ("w0", "w1"):
            procs.append(
                subprocess.Popen(
                    [
                        str(dask),
                        "worker",
                        address,
                        "--nthreads",
                        "1",
                        "--name",
                        name,
                        "--no-dashboard",
                        "--host",
                        "127.0.0.1",
                    ],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        with distributed.Client(address, timeout=30) as c:
            c.wait_for_workers(2, timeout=120)
            yield c
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_worker_killed_mid_run_completes_equal_and_verified(
    dask_cli_cluster, demo_items, tmp_path
):
    # a k-mer floor keeps the workers' start cheap; with small units a worker spends
    # its time embedding, committing and auto-merging, so the kill lands in one
    client = dask_cli_cluster
    store = tmp_path / "store"
    args = ["embeddings", "--model", "kmer-4", "--version", "demo-v1"]
    args += ["--store", str(store), "--unit-tokens", "8000"]
    args += ["--cluster", client.scheduler.address]
    run = subprocess.Popen(
        [sys.executable, "-m", "embedcache.cli", *args],
        cwd=REPO,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    victim = next(iter(client.run(os.getpid).items()))
    killed = False
    try:
        deadline = time.monotonic() + 180
        while run.poll() is None and time.monotonic() < deadline:
            if n_stored(store) >= 100:  # a few units in
                os.kill(victim[1], signal.SIGKILL)  # the nanny starts a new worker
                killed = True
                break
            time.sleep(0.01)
        out, err = run.communicate(timeout=300)
    finally:
        run.kill()
    assert killed, f"the run ended before a worker could be killed:\n{err}"
    assert run.returncode == 0, err
    assert out.strip().splitlines()[-1] == "computed=2400 cached=0"
    seqs = demo_items["seq"].to_list()
    kmer = load_adapter("kmer-4")
    clean = embed_sequences(kmer, seqs, EmbeddingStore(tmp_path / "clean"))
    np.testing.assert_array_equal(stored(store, kmer.key, seqs), clean.vectors)
    assert EmbeddingStore(store).verify() == []
    assert EmbeddingStore(store).keys()[0].n_vectors == 2400
    assert len(client.nthreads()) == 2  # the nanny restarted the killed worker


def test_client_killed_mid_run_then_rerun_computes_only_what_is_missing(
    client, demo_items, tmp_path
):
    store = tmp_path / "store"
    seqs = demo_items["seq"].to_list()
    args = ["embeddings", "--model", "kmer-3", "--version", "demo-v1"]
    args += ["--store", str(store), "--cluster", client.scheduler.address]
    first = subprocess.Popen(
        [sys.executable, "-m", "embedcache.cli", *args, "--unit-tokens", "4000"],
        cwd=REPO,
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while first.poll() is None and time.monotonic() < deadline:
            if n_stored(store) >= 100:  # a few units in
                break
            time.sleep(0.02)
        assert first.poll() is None, "the first run ended before it could be killed"
        first.send_signal(signal.SIGKILL)
    finally:
        first.kill()
        first.wait()
    rerun = subprocess.run(
        [sys.executable, "-m", "embedcache.cli", *args],
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert rerun.returncode == 0, rerun.stderr
    computed, cached = (
        int(part.split("=")[1])
        for part in rerun.stdout.strip().splitlines()[-1].split()
    )
    assert computed + cached == 2400
    assert 0 < computed < 2400  # what the killed run committed is reused
    kmer = load_adapter("kmer-3")
    clean = embed_sequences(kmer, seqs, EmbeddingStore(tmp_path / "clean"))
    np.testing.assert_array_equal(stored(store, kmer.key, seqs), clean.vectors)
    assert EmbeddingStore(store).verify() == []
    assert EmbeddingStore(store).keys()[0].n_vectors == 2400


@pytest.mark.cpu_kind
@pytest.mark.parametrize(
    ("has_bf16", "dtype"), [(True, "bfloat16"), (False, "float32")]
)
def test_auto_dtype_is_resolved_once_on_the_client(monkeypatch, has_bf16, dtype):
    from embedcache.models.shared import cpu_features

    monkeypatch.setattr(cpu_features, "cpu_has_bf16", lambda: has_bf16)
    spec = resolve_spec("kmer-2", options={"dtype": "auto", "device": "cpu"})
    assert spec.options.dtype == dtype
