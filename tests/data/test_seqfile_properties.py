"""Property tests of the sequence reader: any mix of formats, case, line endings,
blank lines, headers and gzip reads back the right sequences in order; junk gives a
clear error naming its line."""

from __future__ import annotations

import gzip
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embedcache.data.seqfile import read_sequences
from embedcache.errors import InvalidSequenceError

SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
bases = st.text(alphabet="ACGTNacgtn", min_size=2, max_size=40)
# anything but a base, a line end, a tab (a TSV's field separator), '>' (a FASTA
# header) or white space (stripped at a line's ends: a FASTA line may wrap there);
# control characters that are white space have their own test below
junk = st.characters(
    blacklist_characters="ACGTNacgtn>", blacklist_categories=("Cs",)
).filter(lambda c: not c.isspace())


@st.composite
def layouts(draw) -> dict:
    """How to write sequences: format, TSV columns, FASTA wrapping, line ends."""
    fmt = draw(st.sampled_from(["lines", "tsv", "fasta"]))
    return {
        "fmt": fmt,
        "extra": draw(st.booleans()),
        "blanks": draw(st.lists(st.integers(0, 2), min_size=12, max_size=12)),
        "width": draw(st.integers(1, 60)),
        "ending": draw(st.sampled_from(["\n", "\r\n", "\r"])),
        "final": draw(st.booleans()),
    }


def build(seqs: list[str], layout: dict) -> tuple[str, list[int]]:
    """The file's text, and the line each sequence starts on (its header in FASTA)."""
    lines: list[str] = []
    starts: list[int] = []
    if layout["fmt"] == "lines":
        for seq in seqs:
            lines.append(seq)
            starts.append(len(lines))
    elif layout["fmt"] == "tsv":
        lines.append("id\tseq\tlabel" if layout["extra"] else "seq")
        for i, seq in enumerate(seqs):
            lines.append(f"r{i}\t{seq}\t{i % 2}" if layout["extra"] else seq)
            starts.append(len(lines))
    else:
        width = layout["width"]
        for i, seq in enumerate(seqs):
            lines.extend([""] * layout["blanks"][i])  # blank lines between records
            lines.append(f">rec{i} some description")
            starts.append(len(lines))
            lines.extend(seq[j : j + width] for j in range(0, len(seq), width))
    ending = layout["ending"]
    return ending.join(lines) + (ending if layout["final"] else ""), starts


def write(text: str, folder: Path, *, gz: bool) -> Path:
    data = text.encode("utf-8")
    path = folder / ("seqs.txt.gz" if gz else "seqs.txt")
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


seq_lists = st.lists(bases, min_size=1, max_size=12)


@SETTINGS
@given(seqs=seq_lists, layout=layouts(), gz=st.booleans())
def test_any_well_formed_file_reads_back_in_order(seqs, layout, gz):
    text, _ = build(seqs, layout)
    with tempfile.TemporaryDirectory() as folder:
        records = read_sequences(write(text, Path(folder), gz=gz))
    assert records.seqs == [s.upper() for s in seqs]


@SETTINGS
@given(seqs=seq_lists, layout=layouts(), gz=st.booleans(), bad=junk, data=st.data())
def test_junk_inside_a_sequence_is_an_error_naming_its_line(
    seqs, layout, gz, bad, data
):
    which = data.draw(st.integers(0, len(seqs) - 1))
    at = data.draw(st.integers(1, len(seqs[which]) - 1))
    seqs = [*seqs]
    seqs[which] = seqs[which][:at] + bad + seqs[which][at:]
    text, starts = build(seqs, layout)
    with tempfile.TemporaryDirectory() as folder:
        path = write(text, Path(folder), gz=gz)
        with pytest.raises(InvalidSequenceError) as err:
            read_sequences(path)
    assert f"line {starts[which]}" in str(err.value)


@pytest.mark.parametrize("control", ["\x0c", "\x0b", "\x1c", "\x1d", "\x1e", "\x85"])
def test_a_control_character_is_not_a_line_break(tmp_path, control):
    path = tmp_path / "seqs.txt"
    path.write_bytes(f"ACGT\nAC{control}GT\nTTTT\n".encode())
    with pytest.raises(InvalidSequenceError, match="line 2"):
        read_sequences(path)
