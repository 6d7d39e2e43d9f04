"""transformers' ``EsmTokenizer`` over a ``vocab.txt``, without importing transformers.

NT-v2 tokenises with ``EsmTokenizer``, which makes every vocabulary entry a no-split
token: the text is cut at the leftmost-longest vocabulary match (6-mers before single
bases in NT-v2's vocabulary); a stretch between matches becomes one ``<unk>`` per
whitespace-separated word, and whitespace alone vanishes; ``<cls>`` goes first and
``<eos>`` last unless ``eos_token`` is null (NT-v2's is). The special flags are the ids
of the special tokens (``<unk>`` among them), wherever they stand. Importing
transformers for this took about 1.5 s of a family's start-up.

tests/models/test_esm_tokens.py checks the ids against ``EsmTokenizer`` itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from embedcache.errors import CheckpointError
from embedcache.models.shared.checkpoint import read_json_object
from embedcache.models.shared.encoder import Encoded

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

VOCAB_FILE = "vocab.txt"
# EsmTokenizer's defaults, then what its two config files may set
DEFAULT_SPECIALS = {
    "unk_token": "<unk>",
    "cls_token": "<cls>",
    "pad_token": "<pad>",
    "mask_token": "<mask>",
    "eos_token": "<eos>",
}
SPECIAL_KEYS = (*DEFAULT_SPECIALS, "bos_token", "sep_token")
EXTRA_KEYS = ("additional_special_tokens", "extra_special_tokens")
CONFIG_FILES = ("special_tokens_map.json", "tokenizer_config.json")
# transformers' "no limit" is 1e30; any limit this large means none
_NO_LIMIT = 10**8


def _content(value: Any, *, where: str, key: str) -> str | None:  # noqa: ANN401
    """A special token as written in a config: a string, null, or ``{"content": ...}``."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    msg = (
        f"{where}: {key} is {value!r}; expected a token string, null or a content dict"
    )
    raise CheckpointError(msg)


def read_specials(
    folder: Path,
    *,
    where: str,
    defaults: Mapping[str, str | None] = DEFAULT_SPECIALS,
) -> tuple[dict[str, str | None], tuple[str, ...], Any]:
    """The special tokens of ``folder``'s tokenizer files and its ``model_max_length``;
    ``defaults``: the tokenizer class's own (``EsmTokenizer``'s unless given).

    Returns
    -------
    (named, extra, model_max_length)
        ``named``: ``unk_token`` ... ``sep_token`` to their token (None: unset);
        ``extra``: additional special tokens; the raw ``model_max_length`` or None.

    Raises
    ------
    CheckpointError
        A file cannot be read; the two files set one token differently (transformers
        versions disagree on which wins); ``split_special_tokens`` is on; or
        ``added_tokens.json`` adds tokens.
    """
    named: dict[str, str | None] = dict.fromkeys(SPECIAL_KEYS)
    named.update(defaults)
    set_by: dict[str, tuple[str, str | None]] = {}
    extra: list[str] = []
    limit = None
    for name in CONFIG_FILES:
        path = folder / name
        if not path.is_file():
            continue
        data = read_json_object(path)
        if data is None:
            msg = f"{where}: {path} holds no JSON object"
            raise CheckpointError(msg)
        for key in SPECIAL_KEYS:
            if key not in data:
                continue
            value = _content(data[key], where=where, key=key)
            if key in set_by and set_by[key][1] != value:
                msg = (
                    f"{where}: {set_by[key][0]} sets {key} to {set_by[key][1]!r} but "
                    f"{name} to {value!r}; make them agree"
                )
                raise CheckpointError(msg)
            set_by[key] = (name, value)
            named[key] = value
        for key in EXTRA_KEYS:
            for token in data.get(key) or []:
                content = _content(token, where=where, key=key)
                if content is not None and content not in extra:
                    extra.append(content)
        if data.get("split_special_tokens"):
            msg = f"{where}: {name} sets split_special_tokens, which NT-v2 never does"
            raise CheckpointError(msg)
        limit = data.get("model_max_length", data.get("max_len", limit))
    added = folder / "added_tokens.json"
    if read_json_object(added):
        msg = f"{where}: added_tokens.json adds tokens to vocab.txt; NT-v2 adds none"
        raise CheckpointError(msg)
    return named, tuple(extra), limit


class EsmVocabTokenizer:
    """``EsmTokenizer``'s ids over a vocabulary, as a
    :class:`~embedcache.models.shared.encoder.SequenceTokenizer`.

    Parameters
    ----------
    tokens
        The lines of ``vocab.txt``, stripped, in order (the id is the line number).
    named
        ``unk_token`` ... ``sep_token`` to their token, None where unset.
    extra
        Further special tokens.
    max_tokens
        The tokenizer's ``model_max_length``; None: no limit.
    """

    def __init__(
        self,
        tokens: Sequence[str],
        *,
        named: dict[str, str | None],
        extra: Sequence[str] = (),
        max_tokens: int | None = None,
        where: str = "tokenizer",
    ) -> None:
        # a repeated line keeps its last id, as EsmTokenizer's dict does
        self._ids = {token: i for i, token in enumerate(tokens) if token}
        self.n_tokens = len(tokens)
        self.max_tokens = max_tokens
        self._longest = max((len(t) for t in self._ids), default=1)
        missing = [
            t for t in (*named.values(), *extra) if t is not None and t not in self._ids
        ]
        if missing:
            msg = (
                f"{where}: special tokens {missing} are not in vocab.txt; "
                "NT-v2's vocabulary holds all of them"
            )
            raise CheckpointError(msg)
        if named["cls_token"] is None or named["pad_token"] is None:
            msg = f"{where}: cls_token and pad_token must be set; NT-v2 uses both"
            raise CheckpointError(msg)
        self.pad_id = self._ids[named["pad_token"]]
        self.cls_id = self._ids[named["cls_token"]]
        unk = named["unk_token"]
        self.unk_id = None if unk is None else self._ids[unk]
        eos = named["eos_token"]
        self.eos_id = None if eos is None else self._ids[eos]
        self.special_ids = frozenset(
            self._ids[t] for t in (*named.values(), *extra) if t is not None
        )

    def __len__(self) -> int:
        return self.n_tokens

    def _unknown(self, text: str, out: list[int]) -> None:
        # EsmTokenizer splits text between vocabulary matches on whitespace and
        # looks each word up; none is in the vocabulary, or it would have matched
        for _word in text.split():
            if self.unk_id is None:
                msg = f"{text!r} is not in the vocabulary and there is no unk_token"
                raise CheckpointError(msg)
            out.append(self.unk_id)

    def ids(self, seq: str) -> list[int]:
        """The ids of ``seq`` with ``<cls>`` first and ``<eos>`` last if set."""
        out = [self.cls_id]
        ids, longest, n = self._ids, self._longest, len(seq)
        i = 0
        unmatched = -1  # start of the text no vocabulary entry matched, if any
        while i < n:
            for length in range(min(longest, n - i), 0, -1):
                found = ids.get(seq[i : i + length])
                if found is not None:
                    break
            else:
                if unmatched < 0:
                    unmatched = i
                i += 1
                continue
            if unmatched >= 0:
                self._unknown(seq[unmatched:i], out)
                unmatched = -1
            out.append(found)
            i += length
        if unmatched >= 0:
            self._unknown(seq[unmatched:], out)
        if self.eos_id is not None:
            out.append(self.eos_id)
        return out

    def encode(self, seq: str) -> Encoded:
        ids = self.ids(seq)
        return Encoded(tuple(ids), tuple(i in self.special_ids for i in ids))

    def encode_many(self, seqs: Sequence[str]) -> list[Encoded]:
        return [self.encode(s) for s in seqs]


def read_vocab_tokenizer(folder: Path, *, where: str) -> EsmVocabTokenizer:
    """The ``EsmTokenizer`` of ``folder`` (``vocab.txt`` and its config files).

    Raises
    ------
    CheckpointError
        No ``vocab.txt``, or the files ask for something ``EsmTokenizer`` would do
        that this does not (see :func:`read_specials`).
    """
    path = folder / VOCAB_FILE
    if not path.is_file():
        msg = (
            f"{where}: no vocab.txt; NT-v2 tokenises with the published 6-mer vocab.txt"
        )
        raise CheckpointError(msg)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        msg = f"cannot read {path}: {err}"
        raise CheckpointError(msg) from err
    named, extra, limit = read_specials(folder, where=where)
    max_tokens = limit if isinstance(limit, int) and 0 < limit < _NO_LIMIT else None
    return EsmVocabTokenizer(
        [line.strip() for line in lines],
        named=named,
        extra=extra,
        max_tokens=max_tokens,
        where=where,
    )


__all__ = ["EsmVocabTokenizer", "read_specials", "read_vocab_tokenizer"]
