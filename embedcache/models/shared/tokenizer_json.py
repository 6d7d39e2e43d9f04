"""A published ``tokenizer.json`` (Hugging Face ``tokenizers``) as a sequence tokenizer.

GENA-LM and DNABERT-2/DNABERT-S tokenise with a BPE stored this way; the special
flags come from the encoding's own special-tokens mask ([CLS] and [SEP]).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from embedcache.errors import CheckpointError
from embedcache.models.shared.encoder import Encoded

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

TOKENIZER_FILE = "tokenizer.json"


def read_tokenizer_json(folder: Path, *, missing: str, unreadable: str) -> Any:  # noqa: ANN401
    """The ``tokenizers.Tokenizer`` of ``folder/tokenizer.json``, padding and
    truncation stored in the file switched off (as the official call without them).

    Raises
    ------
    CheckpointError
        With ``missing`` when there is no file, ``unreadable: <error>`` when it
        cannot be read.
    """
    from tokenizers import Tokenizer

    path = folder / TOKENIZER_FILE
    if not path.is_file():
        raise CheckpointError(missing)
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises plain Exceptions
        msg = f"{unreadable}: {err}"
        raise CheckpointError(msg) from err
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


class JsonTokenizer:
    """A ``tokenizers.Tokenizer`` as a :class:`~embedcache.models.shared.encoder.SequenceTokenizer`."""

    def __init__(self, tokenizer: Any, *, pad_id: int) -> None:  # noqa: ANN401
        self.tokenizer = tokenizer
        self.pad_id = pad_id

    def encode(self, seq: str) -> Encoded:
        return self.encode_many([seq])[0]

    def encode_many(self, seqs: Sequence[str]) -> list[Encoded]:
        if not seqs:
            return []
        encodings = self.tokenizer.encode_batch(list(seqs), add_special_tokens=True)
        return [
            Encoded(tuple(e.ids), tuple(bool(s) for s in e.special_tokens_mask))
            for e in encodings
        ]


__all__ = ["TOKENIZER_FILE", "JsonTokenizer", "read_tokenizer_json"]
