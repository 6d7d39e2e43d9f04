"""`embedcache embed` and `embedcache embeddings`: real models, stores and processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from embedcache.cli import main
from embedcache.engine.local import embed_sequences
from embedcache.hashing import sequence_key
from embedcache.models import load_adapter, resolve_dtype
from tests.cli.helpers import REPO, run_cli
from tests.engine.helpers import MemoryStore, random_seqs, write_small_version


@pytest.fixture
def real_store():
    return pytest.importorskip("embedcache.store")


def last_line(text):
    return text.strip().splitlines()[-1]


def store_files(root):
    return sorted(
        (p.relative_to(root).as_posix(), p.stat().st_size)
        for p in Path(root).rglob("*")
        if p.is_file()
    )


@pytest.mark.cpu_kind
def test_cli_embed_twice_second_run_computes_nothing(
    real_store, tiny_bert_dir, tmp_path, capsys
):
    seqs = random_seqs(12, seed=3)
    (tmp_path / "in.txt").write_text("\n".join([*seqs, seqs[0]]) + "\n")
    args = ["embed", "--model", str(tiny_bert_dir), "--input", str(tmp_path / "in.txt")]
    args += ["--store", str(tmp_path / "store"), "--device", "cpu"]
    args += ["--dtype", "float32"]  # compared with the Python API's float32 below
    assert main([*args, "--output", str(tmp_path / "a.npy")]) == 0
    assert last_line(capsys.readouterr().out) == "computed=12 cached=1"
    assert main([*args, "--output", str(tmp_path / "b.npy")]) == 0
    assert last_line(capsys.readouterr().out) == "computed=0 cached=13"
    a, b = np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy")
    assert a.dtype == np.float32
    assert a.shape == (13, 16)
    np.testing.assert_array_equal(a, b)
    adapter = load_adapter(str(tiny_bert_dir), device="cpu")
    np.testing.assert_allclose(a[:12], adapter.embed_batch(seqs), atol=1e-5, rtol=0)
    np.testing.assert_array_equal(a[12], a[0])


def cli_error(args, capsys):
    code = main(args)
    err = capsys.readouterr().err
    return code, err


@pytest.mark.parametrize(
    ("content", "model", "match"),
    [
        ("", "kmer-2", "holds no sequences"),
        ("ACGT\nACGQ\n", "kmer-2", "line 2: invalid character 'Q' at position 4"),
        ("ACGT\n", "no-such-model", "unknown model 'no-such-model'"),
        ("ACGT\n" + "A" * 70 + "\n", "BERT", "line 2: a 70 bp sequence is 72 tokens"),
    ],
)
def test_cli_bad_inputs_exit_2_and_leave_store_unchanged(
    real_store, tiny_bert_dir, tmp_path, capsys, content, model, match
):
    store = tmp_path / "store"
    warm = tmp_path / "warm.txt"
    warm.write_text("GATTACA\n")
    base = [
        "--store",
        str(store),
        "--device",
        "cpu",
        "--output",
        str(tmp_path / "o.npy"),
    ]
    model = str(tiny_bert_dir) if model == "BERT" else model
    # put something in the store first so "unchanged" is about an existing store
    assert (
        main(["embed", "--model", str(tiny_bert_dir), "--input", str(warm), *base]) == 0
    )
    (tmp_path / "o.npy").unlink()
    before = store_files(store)
    bad = tmp_path / "bad.txt"
    bad.write_text(content)
    capsys.readouterr()
    code, err = cli_error(
        ["embed", "--model", model, "--input", str(bad), *base], capsys
    )
    assert code == 2
    assert match in err
    assert err.startswith("embedcache: error:")
    assert "Traceback" not in err
    assert store_files(store) == before
    assert not (tmp_path / "o.npy").exists()


@pytest.mark.cpu_kind
def test_cli_embed_subprocess_rerun_is_cached(
    real_store, tiny_esm_dir, tmp_path, capsys
):
    (tmp_path / "in.fa").write_text(">a\nACGTACGT\n>b\nGGGNNCCA\n")
    args = ["embed", "--model", str(tiny_esm_dir), "--input", str(tmp_path / "in.fa")]
    args += ["--store", str(tmp_path / "s"), "--output", str(tmp_path / "o.npy")]
    assert main(args) == 0
    assert last_line(capsys.readouterr().out) == "computed=2 cached=0"
    first = np.load(tmp_path / "o.npy")
    second = run_cli(args)
    assert second.returncode == 0, second.stderr
    assert last_line(second.stdout) == "computed=0 cached=2"
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), first)
    # both resolved --dtype auto alike, to what this CPU kind computes in
    [info] = real_store.EmbeddingStore(tmp_path / "s", create=False).keys()
    assert info.key.dtype == resolve_dtype("auto", "cpu")


def test_cli_on_a_pipe_prints_no_bars_or_transformers_warnings(tiny_bert_dir, tmp_path):
    # the suite turns bars off for itself; a user's environment does not
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HF_HUB_DISABLE_PROGRESS_BARS", "TQDM_DISABLE")
    }
    (tmp_path / "in.txt").write_text("ACGTACGT\n")
    args = ["embed", "--model", str(tiny_bert_dir), "--input", str(tmp_path / "in.txt")]
    args += ["--store", str(tmp_path / "s"), "--output", str(tmp_path / "o.npy")]
    done = run_cli(args, env=env)
    assert done.returncode == 0, done.stderr
    assert "Loading weights" not in done.stderr
    assert "not sharded" not in done.stderr
    assert last_line(done.stdout) == "computed=1 cached=0"


@pytest.mark.cpu_kind
def test_renamed_copy_of_a_local_model_hits_the_cache(
    real_store, tiny_bert_dir, tmp_path, capsys
):
    import shutil

    renamed = tmp_path / "renamed-bert"
    shutil.copytree(tiny_bert_dir, renamed)
    (tmp_path / "in.txt").write_text("ACGTACGT\nGGGNNCCA\n")
    store = str(tmp_path / "s")

    def embed(model):
        args = ["embed", "--model", str(model), "--input", str(tmp_path / "in.txt")]
        args += ["--store", store, "--output", str(tmp_path / f"{model.name}.npy")]
        assert main(args) == 0
        return last_line(capsys.readouterr().out)

    assert embed(tiny_bert_dir) == "computed=2 cached=0"
    assert embed(renamed) == "computed=0 cached=2"
    np.testing.assert_array_equal(
        np.load(tmp_path / "renamed-bert.npy"),
        np.load(tmp_path / f"{tiny_bert_dir.name}.npy"),
    )
    # both folder names stay visible beside the one content key (a rerun records
    # the new name even when it computes nothing)
    [info] = real_store.EmbeddingStore(store, create=False).keys()
    assert info.key.model_id == "local"
    assert set(info.aliases) == {tiny_bert_dir.name, "renamed-bert"}
    assert main(["store", "ls", "--store", store]) == 0
    assert "renamed-bert" in capsys.readouterr().out


def kill_mid_run(args, *, after_batches):
    """Start the CLI, SIGKILL it once it logged ``after_batches`` committed batches."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "embedcache.cli", "-v", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    seen = 0
    deadline = time.monotonic() + 120
    try:
        for line in proc.stderr:
            if "stored batch" in line:
                seen += 1
                if seen >= after_batches:
                    os.kill(proc.pid, signal.SIGKILL)
                    break
            if time.monotonic() > deadline:
                break
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
    assert seen >= after_batches, "the run ended before it could be killed"
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.cpu_kind
def test_kill_9_during_embed_then_rerun_gives_identical_arrays(
    real_store, tiny_bert_dir, tmp_path
):
    seqs = random_seqs(60, seed=4, low=33, high=60)
    (tmp_path / "in.txt").write_text("\n".join(seqs) + "\n")
    args = ["embed", "--model", str(tiny_bert_dir), "--input", str(tmp_path / "in.txt")]
    args += ["--device", "cpu", "--dtype", "float32"]
    args += ["--token-budget", "64"]  # 35-61 tokens: one a batch
    args += ["--store", str(tmp_path / "store"), "--output", str(tmp_path / "out.npy")]
    kill_mid_run(args, after_batches=5)
    assert not (tmp_path / "out.npy").exists()
    rerun = run_cli(args)
    assert rerun.returncode == 0, rerun.stderr
    computed = int(last_line(rerun.stdout).split()[0].split("=")[1])
    assert 0 < computed <= 60 - 5  # what was committed before the kill is reused
    # an uninterrupted run plans the same length-sorted batches: the same floats
    adapter = load_adapter(str(tiny_bert_dir), device="cpu")
    clean = embed_sequences(adapter, seqs, MemoryStore(), token_budget=64)
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), clean.vectors)


@pytest.fixture
def small_version(tmp_path):
    """demo-v1's datasets, drawn smaller: 20 train + 30 test items per dataset."""
    return write_small_version(tmp_path / "small-demo.toml")


def test_embeddings_command_prints_counts_and_reruns_cached(
    real_store, small_version, tmp_path, capsys
):
    pytest.importorskip("embedcache.data.subsets")
    args = ["embeddings", "--model", "kmer-3", "--version", str(small_version)]
    args += ["--store", str(tmp_path / "s")]
    assert main(args) == 0
    computed, cached = (
        int(part.split("=")[1]) for part in last_line(capsys.readouterr().out).split()
    )
    assert computed + cached == 100
    assert computed > 0
    assert main(args) == 0
    assert last_line(capsys.readouterr().out) == "computed=0 cached=100"


@pytest.mark.cpu_kind
def test_kill_9_during_embeddings_then_rerun_gives_identical_vectors(
    real_store, small_version, tmp_path
):
    subsets = pytest.importorskip("embedcache.data.subsets")
    from embedcache.data.versions import load_version
    from tests.conftest import save_tiny_bert

    model = save_tiny_bert(tmp_path / "bert512", max_position_embeddings=512)
    args = [
        "embeddings",
        "--model",
        str(model),
        "--version",
        str(small_version),
        "--device",
        "cpu",
        "--dtype",
        "float32",
    ]
    args += [
        "--token-budget",
        "600",
        "--store",
        str(tmp_path / "store"),
    ]  # one item a batch
    kill_mid_run(args, after_batches=5)
    rerun = run_cli(args)
    assert rerun.returncode == 0, rerun.stderr
    assert last_line(rerun.stdout).startswith("computed=")
    seqs = subsets.draw_version(load_version(small_version)).items["seq"].to_list()
    adapter = load_adapter(str(model), device="cpu")
    clean = embed_sequences(adapter, seqs, MemoryStore(), token_budget=600)
    stored, found = real_store.EmbeddingStore(tmp_path / "store").get(
        adapter.key, [sequence_key(seq) for seq in seqs]
    )
    assert found.all()
    np.testing.assert_array_equal(stored, clean.vectors)


@pytest.mark.parametrize("option", ["--token-budget", "--threads", "--unit-tokens"])
def test_cli_sizes_must_be_positive(option, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("ACGT\n")
    args = ["embed", "--model", "kmer-4", "--input", str(tmp_path / "in.txt")]
    args += ["--store", str(tmp_path / "s"), "--output", str(tmp_path / "o.npy")]
    with pytest.raises(SystemExit) as stopped:
        main([*args, option, "0"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: must be a positive whole number, got '0'" in err
    assert not (tmp_path / "s").exists()
