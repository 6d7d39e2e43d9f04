"""`embed_file` over a file of several chunks: read through once to refuse bad items,
then embedded a chunk at a time straight into the output, with the whole-file answer."""

from __future__ import annotations

import numpy as np
import pytest

from embedcache.data import seqfile
from embedcache.engine import local
from embedcache.engine.api import embed_file, embed_into_store
from embedcache.errors import InvalidSequenceError, SequenceTooLongError
from embedcache.store import EmbeddingStore
from tests.engine.helpers import random_seqs

CHUNK = 4


@pytest.fixture
def chunks_seen(monkeypatch):
    """Streams in chunks of CHUNK rows; records how many sequences each engine call got."""
    monkeypatch.setattr(seqfile, "STREAM_ROWS", CHUNK)
    seen: list[int] = []
    real = local.embed_sequences

    def spy(adapter, seqs, store, **kwargs):
        seen.append(len(seqs))
        return real(adapter, seqs, store, **kwargs)

    monkeypatch.setattr(local, "embed_sequences", spy)
    return seen


def write_lines(path, seqs):
    path.write_text("".join(f"{s}\n" for s in seqs))
    return path


def test_a_streamed_file_equals_the_whole_file_run(tmp_path, chunks_seen):
    seqs = random_seqs(11, seed=3)
    # repeats inside a chunk and across chunks (row 9 repeats row 1, row 10 row 5)
    seqs = [*seqs[:3], seqs[0], *seqs[4:9], seqs[1], seqs[5].lower()]
    path = write_lines(tmp_path / "seqs.txt", seqs)
    streamed = embed_file(
        path, "kmer-2", tmp_path / "store", output=tmp_path / "out.npy"
    )
    assert chunks_seen == [4, 4, 3]  # no call held more than one chunk
    # the same answer as one call over the whole list
    whole_store = EmbeddingStore(tmp_path / "whole")
    whole = embed_into_store("kmer-2", [s.upper() for s in seqs], whole_store)
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), whole.vectors)
    np.testing.assert_array_equal(streamed.vectors, whole.vectors)
    distinct = len({s.upper() for s in seqs})
    assert (streamed.n_computed, streamed.n_cached) == (distinct, len(seqs) - distinct)
    assert streamed.keys == whole.keys
    again = embed_file(path, "kmer-2", tmp_path / "store", output=tmp_path / "b.npy")
    assert (again.n_computed, again.n_cached) == (0, len(seqs))
    np.testing.assert_array_equal(np.load(tmp_path / "b.npy"), whole.vectors)


def test_without_output_the_vectors_come_back_in_memory(tmp_path, chunks_seen):
    seqs = random_seqs(9, seed=4)
    path = write_lines(tmp_path / "seqs.txt", seqs)
    result = embed_file(path, "kmer-1", tmp_path / "store")
    assert chunks_seen == [4, 4, 1]
    alone = embed_file(
        write_lines(tmp_path / "one.txt", seqs[8:]), "kmer-1", tmp_path / "s2"
    )
    assert isinstance(result.vectors, np.ndarray)
    assert result.vectors.shape == (9, 4)
    np.testing.assert_array_equal(result.vectors[8], alone.vectors[0])


def test_a_bad_item_in_a_later_chunk_leaves_store_and_output_untouched(
    tmp_path, chunks_seen
):
    seqs = random_seqs(10, seed=5)
    seqs[9] = seqs[9][:3] + "X" + seqs[9][3:]
    path = write_lines(tmp_path / "seqs.txt", seqs)
    out = tmp_path / "out.npy"
    out.write_bytes(b"the previous answer")
    with pytest.raises(InvalidSequenceError, match="line 10: invalid character 'X'"):
        embed_file(path, "kmer-2", tmp_path / "store", output=out)
    assert chunks_seen == []  # found in the read-through, before any chunk ran
    assert not (tmp_path / "store").exists()  # the store was never opened
    assert out.read_bytes() == b"the previous answer"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_too_long_item_in_a_later_chunk_is_refused_before_anything_runs(
    tmp_path, chunks_seen, tiny_bert_dir
):
    seqs = [*random_seqs(9, seed=6), "A" * 100]  # the tiny BERT takes 64 tokens
    path = write_lines(tmp_path / "seqs.txt", seqs)
    store = tmp_path / "store"
    with pytest.raises(SequenceTooLongError, match="line 10: a 100 bp sequence"):
        embed_file(path, str(tiny_bert_dir), store, output=tmp_path / "o.npy")
    assert chunks_seen == []
    assert not store.exists()
    assert not (tmp_path / "o.npy").exists()


def test_fasta_chunks_name_records_by_their_place_in_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(seqfile, "STREAM_ROWS", 2)
    path = tmp_path / "s.fa"
    path.write_text(">a\nACGT\n>\nGG\n>\nTT\nAA\n> \nCC\n>e x\nAC\n")
    chunks = list(seqfile.iter_records(path))
    assert [len(c) for c in chunks] == [2, 2, 1]
    names = [n for c in chunks for n in c.names]
    assert names == [
        "record 'a' (line 1)",
        "record '#2' (line 3)",
        "record '#3' (line 5)",
        "record '#4' (line 8)",
        "record 'e' (line 10)",
    ]
    assert [s for c in chunks for s in c.seqs] == ["ACGT", "GG", "TTAA", "CC", "AC"]
    assert list(seqfile.read_sequences(path).names) == names


def test_tsv_chunks_name_rows_by_their_line(tmp_path, monkeypatch):
    monkeypatch.setattr(seqfile, "STREAM_ROWS", 2)
    path = tmp_path / "s.tsv"
    path.write_text("id\tseq\n1\tACGT\n2\tGG\n3\tTT\n")
    chunks = list(seqfile.iter_records(path))
    assert [list(c.names) for c in chunks] == [["line 2", "line 3"], ["line 4"]]
    assert [list(c.seqs) for c in chunks] == [["ACGT", "GG"], ["TT"]]


def test_a_streamed_cli_run_prints_its_counts(tmp_path, capsys, chunks_seen):
    from embedcache.cli import main

    seqs = random_seqs(6, seed=7)
    path = write_lines(tmp_path / "seqs.txt", [*seqs, seqs[0]])
    out = tmp_path / "out.npy"
    args = ["embed", "--model", "kmer-2", "--input", str(path), "--output", str(out)]
    assert main([*args, "--store", str(tmp_path / "store")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == "computed=6 cached=1"
    assert chunks_seen == [4, 3]
    assert np.load(out).shape[0] == 7


def test_rows_written_in_blocks_make_the_same_npy_and_a_short_run_leaves_none(tmp_path):
    from embedcache.engine.output import npy_rows, write_npy

    rows = np.random.default_rng(8).random((7, 3), dtype=np.float32)
    with npy_rows(tmp_path / "a.npy", rows.shape) as sink:
        sink.write(rows[:4])
        sink.write(rows[4:])
    write_npy(tmp_path / "b.npy", rows)
    assert (tmp_path / "a.npy").read_bytes() == (tmp_path / "b.npy").read_bytes()
    np.testing.assert_array_equal(sink.result(), rows)
    with (
        pytest.raises(ValueError, match="4 of 7 rows"),
        npy_rows(tmp_path / "c.npy", rows.shape) as short,
    ):
        short.write(rows[:4])
    with (
        pytest.raises(ValueError, match="do not fit"),
        npy_rows(tmp_path / "d.npy", rows.shape) as long,
    ):
        long.write(np.vstack([rows, rows]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy", "b.npy"]
    with npy_rows(None, rows.shape) as memory:
        memory.write(rows)
    np.testing.assert_array_equal(memory.result(), rows)
