from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embedcache.cli import main
from embedcache.engine.embed import (
    BatchRule,
    EmbedResult,
    embed_sequences,
    plan_batches,
)
from embedcache.errors import InvalidSequenceError, SequenceTooLongError
from embedcache.hashing import sequence_key
from embedcache.models import load_adapter

REPO = Path(__file__).resolve().parents[2]


class MemoryStore:
    """The store's lookup/put contract in memory, counting puts (one per committed batch)."""

    def __init__(self):
        self.data = {}
        self.puts = []
        self.aliases = {}

    def contains(self, key, hashes):
        return np.array([(key, h) in self.data for h in hashes], dtype=bool)

    def get(self, key, hashes):
        found = self.contains(key, hashes)
        dim = next((v.shape[0] for (k, _), v in self.data.items() if k == key), 0)
        out = np.full((len(hashes), dim), np.nan, dtype=np.float32)
        for row, digest in enumerate(hashes):
            if found[row]:
                out[row] = self.data[key, digest]
        return out, found

    def put(self, key, hashes, vectors, alias=None):
        # as the real store: a call commits only new rows or a new alias
        fresh = [(h, v) for h, v in zip(hashes, vectors, strict=True)]
        fresh = [(h, v) for h, v in fresh if (key, h) not in self.data]
        known = self.aliases.setdefault(key, set())
        if not fresh and (alias is None or alias in known):
            return 0
        self.puts.append(len(hashes))
        known.update({alias} - {None})
        for digest, vector in fresh:
            self.data[key, digest] = np.array(vector, dtype=np.float32)
        return len({h for h, _ in fresh})


def random_seqs(n, *, seed=0, low=5, high=40):
    rng = np.random.default_rng(seed)
    return [
        "".join(rng.choice(list("ACGT"), size=rng.integers(low, high)))
        for _ in range(n)
    ]


@pytest.fixture
def bert(tiny_bert_dir):
    return load_adapter(str(tiny_bert_dir), device="cpu")


# --- batching plan ------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 50), max_size=60),
    budget=st.integers(1, 300),
    equal=st.booleans(),
    maps=st.integers(0, 4),
    scores=st.integers(1, 20_000),
)
def test_plan_batches_covers_each_item_once_within_budget(
    lengths, budget, equal, maps, scores
):
    rule = BatchRule(budget, equal, attention_maps=maps, score_budget=scores)
    batches = plan_batches(lengths, rule)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    for batch in batches:
        longest = max(lengths[i] for i in batch)
        assert len(batch) == 1 or longest * len(batch) <= budget
        assert len(batch) == 1 or len(batch) * maps * longest**2 <= scores
        if equal:
            assert len({lengths[i] for i in batch}) == 1


def test_plan_batches_groups_by_length():
    lengths = [10, 3, 10, 3, 7]
    assert plan_batches(lengths, BatchRule(20)) == [[1, 3], [4, 0], [2]]
    assert plan_batches(lengths, BatchRule(100, equal_lengths=True)) == [
        [1, 3],
        [4],
        [0, 2],
    ]
    assert plan_batches(lengths, BatchRule(100)) == [[1, 3, 4, 0, 2]]


def test_attention_scores_shrink_batches_of_long_sequences():
    # the same token budget: short sequences fill it, long ones stop at the score
    # budget (3 x 2 maps x 10^2 = 600), and one sequence runs whatever its length
    rule = BatchRule(1000, attention_maps=2, score_budget=600)
    assert [len(b) for b in plan_batches([5] * 30, rule)] == [12, 12, 6]
    assert [len(b) for b in plan_batches([10] * 7, rule)] == [3, 3, 1]
    assert plan_batches([100, 100], rule) == [[0], [1]]


def test_a_budget_below_one_token_is_refused():
    with pytest.raises(ValueError, match="token budget must be positive"):
        BatchRule(0)


# --- engine -------------------------------------------------------------------------


def test_engine_matches_adapter_in_input_order(bert):
    seqs = random_seqs(20)
    store = MemoryStore()
    result = embed_sequences(bert, seqs, store, token_budget=200)
    assert isinstance(result, EmbedResult)
    assert result.vectors.dtype == np.float32
    assert result.vectors.shape == (20, bert.dim)
    alone = np.concatenate([bert.embed_batch([seq]) for seq in seqs])
    np.testing.assert_allclose(result.vectors, alone, atol=1e-5, rtol=0)
    assert (result.n_computed, result.n_cached) == (20, 0)


def test_batched_equals_unbatched(bert):
    seqs = random_seqs(30, seed=1)
    one_by_one, batched = MemoryStore(), MemoryStore()
    a = embed_sequences(bert, seqs, one_by_one, token_budget=1)
    b = embed_sequences(bert, seqs, batched, token_budget=10_000)
    assert len(one_by_one.puts) == 30  # one commit per batch
    assert batched.puts == [30]
    np.testing.assert_allclose(a.vectors, b.vectors, atol=1e-5, rtol=0)


def test_only_missing_are_computed_and_duplicates_once(bert):
    store = MemoryStore()
    first = random_seqs(10, seed=2)
    embed_sequences(bert, first, store)
    more = [*first[:4], "ACGTACGT", "acgtacgt", first[0]]
    result = embed_sequences(bert, more, store)
    # ACGTACGT and acgtacgt are one sequence (case is normalised): computed once
    assert (result.n_computed, result.n_cached) == (1, 6)
    assert store.puts[-1] == 1
    np.testing.assert_array_equal(result.vectors[4], result.vectors[5])
    again = embed_sequences(bert, more, store)
    assert (again.n_computed, again.n_cached) == (0, 7)
    np.testing.assert_array_equal(again.vectors, result.vectors)


def test_too_long_item_is_named_and_store_unchanged(bert):
    store = MemoryStore()
    seqs = ["ACGT", "A" * 100, "GGCC"]
    with pytest.raises(
        SequenceTooLongError, match=r"item-b: a 100 bp sequence is 102 tokens"
    ):
        embed_sequences(bert, seqs, store, names=["item-a", "item-b", "item-c"])
    assert store.data == {}
    assert store.puts == []


def test_bad_character_is_named_and_store_unchanged(bert):
    store = MemoryStore()
    with pytest.raises(
        InvalidSequenceError, match=r"sequence #1 \(0-based\): invalid character 'Z'"
    ):
        embed_sequences(bert, ["ACGT", "ACZT"], store)
    assert store.puts == []


def test_truncation_policy_lets_long_items_through(tiny_bert_dir):
    adapter = load_adapter(str(tiny_bert_dir), device="cpu", truncation="right")
    result = embed_sequences(adapter, ["A" * 100, "ACGT"], MemoryStore())
    assert result.n_computed == 2


def test_kmer_engine_and_empty_input():
    adapter = load_adapter("kmer-2")
    store = MemoryStore()
    result = embed_sequences(adapter, ["ACGT", "NNNN", "ACGT"], store)
    assert (result.n_computed, result.n_cached) == (2, 1)
    assert result.vectors[1].sum() == 0
    empty = embed_sequences(adapter, [], store)
    assert empty.vectors.shape == (0, 16)


def test_store_is_keyed_by_sequence_hash(bert):
    store = MemoryStore()
    embed_sequences(bert, ["acgt"], store)
    assert (bert.key, sequence_key("ACGT")) in store.data


# --- CLI ----------------------------------------------------------------------------


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


def test_cli_embed_twice_second_run_computes_nothing(
    real_store, tiny_bert_dir, tmp_path, capsys
):
    seqs = random_seqs(12, seed=3)
    (tmp_path / "in.txt").write_text("\n".join([*seqs, seqs[0]]) + "\n")
    args = ["embed", "--model", str(tiny_bert_dir), "--input", str(tmp_path / "in.txt")]
    args += ["--store", str(tmp_path / "store"), "--device", "cpu"]
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


def run_cli(args, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "embedcache.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
        **kwargs,
    )


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


def test_kill_9_during_embed_then_rerun_gives_identical_arrays(
    real_store, tiny_bert_dir, tmp_path
):
    seqs = random_seqs(60, seed=4, low=33, high=60)
    (tmp_path / "in.txt").write_text("\n".join(seqs) + "\n")
    args = ["embed", "--model", str(tiny_bert_dir), "--input", str(tmp_path / "in.txt")]
    args += ["--device", "cpu", "--token-budget", "64"]  # 35-61 tokens: one a batch
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
    path = tmp_path / "small-demo.toml"
    entry = """
[[datasets]]
name = "{name}"
source = "demo"
test_split = "demo"
train_split = "demo"
n_test = 30
n_train = 20
"""
    text = 'name = "small-demo"\nseed = 20261006\ncomparable = false\n'
    text += "".join(
        entry.format(name=n)
        for n in ("human_enhancers_cohn", "human_nontata_promoters")
    )
    path.write_text(text)
    return path


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
