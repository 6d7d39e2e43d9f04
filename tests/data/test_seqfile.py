from __future__ import annotations

import gzip

import pytest

from embedcache.data.seqfile import read_sequences, validate_sequence
from embedcache.errors import InputFileError, InvalidSequenceError


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_one_sequence_a_line_upper_cases(tmp_path):
    path = write(tmp_path, "seqs.txt", "ACGT\nacgtn\r\nNNA\n")
    records = read_sequences(path)
    assert records.format == "lines"
    assert records.seqs == ["ACGT", "ACGTN", "NNA"]
    assert records.names == ["line 1", "line 2", "line 3"]


@pytest.mark.parametrize(
    ("name", "text", "line", "what"),
    [
        ("a.txt", "ACGT\n\nacgtn\nNNA\n", 2, "one-sequence-a-line file"),
        ("b.txt", "ACGT\n   \nNNA\n", 2, "one-sequence-a-line file"),
        ("c.txt", "\nACGT\n", 1, "one-sequence-a-line file"),
        ("d.txt", "ACGT\r\nGG\r\n\r\n", 3, "one-sequence-a-line file"),
        ("e.tsv", "seq\tlabel\nACGT\t1\n\nGG\t0\n", 3, "TSV"),
        ("f.tsv", "seq\tlabel\nACGT\t1\n\t\nGG\t0\n", 3, "TSV"),
        ("g.tsv", "seq\nACGT\nGG\n\n", 4, "TSV"),
    ],
)
def test_blank_line_is_an_error_naming_it(tmp_path, name, text, line, what):
    # a skipped row would shift every later output row against the user's labels
    with pytest.raises(InputFileError, match=rf"line {line}: blank line in a {what}"):
        read_sequences(write(tmp_path, name, text))


@pytest.mark.parametrize("text", ["ACGT\nGG", "ACGT\nGG\n", "ACGT\r\nGG\r\n"])
def test_final_newline_is_not_a_blank_line(tmp_path, text):
    assert read_sequences(write(tmp_path, "s.txt", text)).seqs == ["ACGT", "GG"]
    tsv = write(tmp_path, "s.tsv", "seq\n" + text)
    assert read_sequences(tsv).seqs == ["ACGT", "GG"]


def test_blank_lines_between_fasta_records_are_allowed(tmp_path):
    path = write(tmp_path, "s.fa", ">a\nACGT\n\n>b\nGG\n\n")
    assert read_sequences(path).seqs == ["ACGT", "GG"]


def test_blank_row_stores_nothing(tmp_path, capsys):
    from embedcache.cli import main

    path = write(tmp_path, "seqs.tsv", "seq\nACGT\n\nGGCC\n")
    store = tmp_path / "store"
    args = ["embed", "--model", "kmer-2", "--input", str(path)]
    code = main([*args, "--output", str(tmp_path / "out.npy"), "--store", str(store)])
    assert code == 2
    assert "line 3: blank line in a TSV" in capsys.readouterr().err
    assert not (tmp_path / "out.npy").exists()
    assert not store.exists()  # failed before the store was opened


def test_tsv_uses_the_seq_column(tmp_path):
    path = write(tmp_path, "seqs.tsv", "label\tseq\tother\n1\tACGT\tx\n0\tggcc\ty\n")
    records = read_sequences(path)
    assert records.format == "tsv"
    assert records.seqs == ["ACGT", "GGCC"]
    assert records.names == ["line 2", "line 3"]


def test_fasta_joins_wrapped_lines(tmp_path):
    path = write(
        tmp_path, "seqs.fa", ">chr1_100 some description\nACGT\nAC\n>second\nNNNN\n"
    )
    records = read_sequences(path)
    assert records.format == "fasta"
    assert records.seqs == ["ACGTAC", "NNNN"]
    assert records.names == ["record 'chr1_100' (line 1)", "record 'second' (line 4)"]


def test_gzip_input(tmp_path):
    path = tmp_path / "seqs.txt.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("ACGT\nTTTT\n")
    assert read_sequences(path).seqs == ["ACGT", "TTTT"]


@pytest.mark.parametrize("text", ["", "\n\n  \n"])
def test_empty_file_is_an_error(tmp_path, text):
    with pytest.raises(InputFileError, match="holds no sequences"):
        read_sequences(write(tmp_path, "empty.txt", text))


def test_header_only_tsv_is_an_error(tmp_path):
    with pytest.raises(InputFileError, match="no sequences"):
        read_sequences(write(tmp_path, "h.tsv", "seq\tlabel\n"))


def test_tsv_without_seq_column_is_an_error(tmp_path):
    with pytest.raises(InputFileError, match="no 'seq' column"):
        read_sequences(write(tmp_path, "x.tsv", "sequence\tlabel\nACGT\t1\n"))


def test_bad_character_names_line_character_and_position(tmp_path):
    path = write(tmp_path, "seqs.txt", "ACGT\nACGXT\n")
    with pytest.raises(
        InvalidSequenceError, match=r"line 2: invalid character 'X' at position 4"
    ):
        read_sequences(path)


def test_bad_character_in_tsv_and_fasta(tmp_path):
    with pytest.raises(
        InvalidSequenceError, match=r"line 3: invalid character 'U' at position 2"
    ):
        read_sequences(write(tmp_path, "a.tsv", "seq\tlabel\nAC\t0\nAU\t1\n"))
    with pytest.raises(
        InvalidSequenceError, match=r"record 'r2' \(line 3\).*'-' at position 3"
    ):
        read_sequences(write(tmp_path, "a.fa", ">r1\nACGT\n>r2\nAC-G\n"))


def test_non_ascii_is_rejected_not_dropped(tmp_path):
    path = tmp_path / "seqs.txt"
    path.write_bytes("ACÄGT\n".encode())
    with pytest.raises(InvalidSequenceError, match="position 3"):
        read_sequences(path)


def test_empty_fasta_record_is_an_error(tmp_path):
    with pytest.raises(
        InvalidSequenceError, match=r"record 'empty' \(line 1\): the sequence is empty"
    ):
        read_sequences(write(tmp_path, "e.fa", ">empty\n>full\nACGT\n"))


def test_missing_file_is_an_input_error(tmp_path):
    with pytest.raises(InputFileError, match="cannot read"):
        read_sequences(tmp_path / "nope.txt")


def test_validate_sequence():
    assert validate_sequence("acgtN", "x") == "ACGTN"
    with pytest.raises(InvalidSequenceError, match="item 7: the sequence is empty"):
        validate_sequence("", "item 7")


def test_one_column_tsv(tmp_path):
    records = read_sequences(write(tmp_path, "one.tsv", "seq\nACGT\nGG\n"))
    assert records.format == "tsv"
    assert records.seqs == ["ACGT", "GG"]


def test_rows_of_a_line_file_are_packed_yet_behave_as_lists(tmp_path):
    records = read_sequences(write(tmp_path, "s.txt", "acgt\nGG\nNNA\n"))
    seqs, names = records.seqs, records.names
    assert not isinstance(seqs, list)  # packed: no string per row is kept
    assert (len(seqs), seqs[0], seqs[-1], seqs[1:]) == (3, "ACGT", "NNA", ["GG", "NNA"])
    assert (names[0], names[-1], names[:2]) == (
        "line 1",
        "line 3",
        ["line 1", "line 2"],
    )
    assert list(seqs) == ["ACGT", "GG", "NNA"]
    assert seqs != ["ACGT", "GG"]
    assert names == ["line 1", "line 2", "line 3"] != ["line 1"]
    with pytest.raises(IndexError):
        seqs[3]
    with pytest.raises(IndexError):
        names[-4]
    tsv = read_sequences(write(tmp_path, "t.tsv", "id\tseq\na\tAC\nb\tGT\n"))
    assert (tsv.seqs, tsv.names) == (["AC", "GT"], ["line 2", "line 3"])
