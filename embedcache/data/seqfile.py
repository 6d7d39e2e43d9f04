"""Read the sequences given to ``embedcache embed``: a TSV with a ``seq`` column, FASTA,
or one sequence a line (``.gz`` accepted for each).

The format is detected from the content: a first line starting with ``>`` is FASTA,
a first line holding a tab and a ``seq`` field is a TSV header, anything else is one
sequence a line. In a TSV or a one-sequence-a-line file every line is one row, so a
blank line is an error naming it (skipping it would shift the output's rows against the
user's labels); the newline ending the last line is not a blank line. FASTA names its
records, so blank lines between them are allowed. Every sequence is checked: only A, C,
G, T and N (any case) are allowed; an error names the line or record, the character and
its position.
"""

from __future__ import annotations

import gzip
import itertools
import logging
import re
import sys
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO, overload

from embedcache.errors import InputFileError, InvalidSequenceError
from embedcache.hashing import normalise_sequence

logger = logging.getLogger(__name__)


class _Rows(Sequence[str]):
    """A read-only sequence of strings that compares equal to a list of them."""

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...
    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self._item(i) for i in range(*index.indices(len(self)))]
        i = index + len(self) if index < 0 else index
        if not 0 <= i < len(self):
            msg = f"row {index} of {len(self)}"
            raise IndexError(msg)
        return self._item(i)

    def _item(self, i: int) -> str:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(self) == len(other) and all(
                a == b for a, b in zip(self, other, strict=True)
            )
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, so unhashable

    def __repr__(self) -> str:
        head = ", ".join(repr(x) for x in self[:3])
        return f"{type(self).__name__}([{head}{', ...' if len(self) > 3 else ''}])"


class PackedSequences(_Rows):
    """Sequences as one ASCII buffer and their end offsets, each a ``str`` on access.

    ~1 byte a base and 8 a row, where a list of strings costs ~50 bytes a row more
    (a million short sequences: ~50 MB instead of ~100 MB).
    """

    def __init__(self) -> None:
        self._data = bytearray()
        self._ends = array("q")

    def append(self, seq: str) -> None:
        self._data += seq.encode("ascii")
        self._ends.append(len(self._data))

    def __len__(self) -> int:
        return len(self._ends)

    def _item(self, i: int) -> str:
        start = self._ends[i - 1] if i else 0
        return self._data[start : self._ends[i]].decode("ascii")


class LineNames(_Rows):
    """``"line N"`` for rows on consecutive lines from ``first``, made on access."""

    def __init__(self, first: int, n: int) -> None:
        self._first, self._n = first, n

    def __len__(self) -> int:
        return self._n

    def _item(self, i: int) -> str:
        return f"line {self._first + i}"


_INVALID = re.compile(r"[^ACGTNacgtn]")
_LINE_END = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class SequenceRecords:
    """Sequences in file order, upper-cased, each with a name for error messages.

    Both are sequences of strings; for a file of one row a line they are packed
    (:class:`PackedSequences`, :class:`LineNames`): no Python string per row is
    kept, so a million rows cost ~50 MB rather than ~170 MB.
    """

    seqs: Sequence[str]
    names: Sequence[str]  # "line 3", or "record chr1_100 (line 7)" for FASTA
    format: str  # "tsv" | "fasta" | "lines"

    def __len__(self) -> int:
        return len(self.seqs)


def validate_sequence(seq: str, name: str) -> str:
    """Return the upper-cased sequence, or raise naming ``name``, the character and position.

    Raises
    ------
    InvalidSequenceError
        The sequence is empty or holds a character other than A/C/G/T/N.
    """
    if not seq:
        msg = f"{name}: the sequence is empty"
        raise InvalidSequenceError(msg)
    bad = _INVALID.search(seq)
    if bad is not None:
        msg = (
            f"{name}: invalid character {bad.group()!r} at position {bad.start() + 1} "
            f"(1-based, sequence length {len(seq)}); allowed are A, C, G, T and N in any "
            "case. Fix or drop this sequence."
        )
        raise InvalidSequenceError(msg)
    return normalise_sequence(seq)


# rows a streamed read hands over at a time (:func:`iter_records`)
STREAM_ROWS = 1 << 20


def read_sequences(path: Path) -> SequenceRecords:
    """Read and validate every sequence of ``path``, in file order.

    Raises
    ------
    InputFileError
        The file cannot be read, holds no sequence, a TSV lacks the ``seq`` column, or
        a TSV or one-sequence-a-line file has a blank line.
    InvalidSequenceError
        A sequence is empty or holds a character other than A/C/G/T/N.
    """
    path = Path(path)
    (records,) = iter_records(path, rows=sys.maxsize)
    logger.info("read %d sequences from %s (%s)", len(records), path, records.format)
    return records


def iter_records(path: Path, *, rows: int | None = None) -> Iterator[SequenceRecords]:
    """The sequences of ``path`` in file order, ``rows`` (default
    :data:`STREAM_ROWS`) at a time, read as they come.

    Only one chunk of the file is held: a genome's windows stream through in bounded
    memory. Each chunk names its items by their line in the whole file. The errors are
    :func:`read_sequences`' and come when the reader reaches the bad line, so a caller
    that must refuse a bad file before acting reads it through once first.
    """
    path, rows = Path(path), rows or STREAM_ROWS
    lines = _numbered_lines(path)
    leading: list[int] = []  # blank lines before the first row
    for number, head in lines:
        if head.strip():
            break
        leading.append(number)
    else:
        msg = f"{path} holds no sequences (the file is empty); give one sequence a line, FASTA, or a TSV with a 'seq' column"
        raise InputFileError(msg)
    if head.startswith(">"):
        chunks = _fasta_chunks(itertools.chain([(number, head)], lines), path, rows)
    elif "seq" in [f.strip() for f in head.split("\t")]:  # a one-column TSV too
        _reject_blank_lines(leading, path, what="TSV")
        chunks = _tsv_chunks(head, number, lines, path, rows)
    elif "\t" in head:
        msg = (
            f"{path}, line {number}: the first line looks like a TSV header but has no "
            f"'seq' column (fields: {head.split(chr(9))}); name the sequence column 'seq'"
        )
        raise InputFileError(msg)
    else:
        _reject_blank_lines(leading, path, what="one-sequence-a-line file")
        chunks = _plain_chunks(itertools.chain([(number, head)], lines), path, rows)
    empty = True
    for chunk in chunks:
        empty = False
        yield chunk
    if empty:
        msg = f"{path} has a header but no sequences"
        raise InputFileError(msg)


def _numbered_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based number, text without its line end) of each line of ``path``."""
    # errors="replace" keeps a non-ASCII byte visible as U+FFFD, so validation names
    # its position. Universal newlines end a line only at \n, \r\n or \r: splitting
    # at form feeds and other control characters (str.splitlines) would turn one bad
    # line into two rows.
    try:
        with _open_text(path) as fh:
            for number, line in enumerate(fh, start=1):
                yield number, line.removesuffix("\n")
    except (OSError, EOFError) as err:  # EOFError: a truncated .gz
        msg = f"cannot read input file {path}: {err}"
        raise InputFileError(msg) from err


def _open_text(path: Path) -> TextIO:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="ascii", errors="replace", newline=None)
    return path.open(encoding="ascii", errors="replace", newline=None)


def _reject_blank_lines(numbers: Iterable[int], path: Path, *, what: str) -> None:
    """Raise naming the first of ``numbers`` (blank lines): each line is one row."""
    for number in numbers:
        msg = (
            f"{path}, line {number}: blank line in a {what}; every line must hold "
            "one row, and skipping it would shift the output rows against the input's "
            f"(e.g. your labels). Remove line {number} or put its sequence there."
        )
        raise InputFileError(msg)


def _line_rows(
    lines: Iterable[tuple[int, str]],
    path: Path,
    rows: int,
    *,
    what: str,
    field: Callable[[int, str], str],
    fmt: str,
) -> Iterator[SequenceRecords]:
    """Chunks of a file with one row a line, each row's sequence ``field(number, line)``."""
    seqs, first = PackedSequences(), 0
    for number, line in lines:
        if not line.strip():
            _reject_blank_lines([number], path, what=what)
        if not len(seqs):
            first = number
        seqs.append(
            validate_sequence(field(number, line).strip(), f"{path}, line {number}")
        )
        if len(seqs) == rows:
            yield SequenceRecords(seqs=seqs, names=LineNames(first, rows), format=fmt)
            seqs = PackedSequences()
    if len(seqs):
        yield SequenceRecords(seqs=seqs, names=LineNames(first, len(seqs)), format=fmt)


def _plain_chunks(
    lines: Iterable[tuple[int, str]], path: Path, rows: int
) -> Iterator[SequenceRecords]:
    return _line_rows(
        lines,
        path,
        rows,
        what="one-sequence-a-line file",
        field=lambda _, line: line,
        fmt="lines",
    )


def _tsv_chunks(
    header: str,
    header_at: int,
    lines: Iterable[tuple[int, str]],
    path: Path,
    rows: int,
) -> Iterator[SequenceRecords]:
    column = [field.strip() for field in header.split("\t")].index("seq")

    def field(number: int, line: str) -> str:
        fields = line.split("\t")
        if len(fields) <= column:
            msg = (
                f"{path}, line {number}: {len(fields)} fields, but the 'seq' column is "
                f"field {column + 1} of the header"
            )
            raise InputFileError(msg)
        return fields[column]

    return _line_rows(lines, path, rows, what="TSV", field=field, fmt="tsv")


def _fasta_chunks(
    lines: Iterable[tuple[int, str]], path: Path, rows: int
) -> Iterator[SequenceRecords]:
    seqs: list[str] = []
    names: list[str] = []
    record: str | None = None
    record_line = 0
    before = 0  # records in the chunks handed over
    parts: list[str] = []

    def flush() -> None:
        name = f"record {record!r} (line {record_line})"
        seqs.append(validate_sequence("".join(parts), f"{path}, {name}"))
        names.append(name)

    for number, line in lines:
        text = line.strip()
        if text.startswith(">"):
            if record is not None:
                flush()
                if len(seqs) == rows:
                    yield SequenceRecords(seqs=seqs, names=names, format="fasta")
                    before += len(seqs)
                    seqs, names = [], []
            header = text[1:].split()
            record = header[0] if header else f"#{before + len(seqs) + 1}"
            record_line = number
            parts = []
        elif text:
            parts.append(text)
    if record is not None:
        flush()
    if seqs:
        yield SequenceRecords(seqs=seqs, names=names, format="fasta")
