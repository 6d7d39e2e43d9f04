"""Reading a published config.json: typed fields, and refusing variants we do not run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from embedcache.errors import CheckpointError

if TYPE_CHECKING:
    from collections.abc import Mapping


def positive_int(
    config: Mapping[str, Any], name: str, *, where: str, default: int | None = None
) -> int:
    """``config[name]`` (or ``default``) as a positive integer; bools do not count."""
    value = config.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        msg = f"{where}: {name} must be a positive integer, got {value!r}"
        raise CheckpointError(msg)
    return value


def require_published(
    checks: Mapping[str, tuple[object, object]], *, where: str, what: str
) -> None:
    """Refuse a config whose fields (name -> (published value, its value)) differ:
    ``what`` names the architecture the module implements."""
    for name, (wanted, got) in checks.items():
        if got != wanted:
            msg = (
                f"{where}: {name} is {got!r}; the {what} adapter implements the "
                f"published {what} architecture ({name} {wanted!r}) only"
            )
            raise CheckpointError(msg)


def require_token_id(name: str, token_id: int, vocab_size: int, *, where: str) -> None:
    """Refuse a special token id (``name``) outside ``0 .. vocab_size - 1``."""
    if not 0 <= token_id < vocab_size:
        msg = f"{where}: {name} {token_id} is outside the vocabulary"
        raise CheckpointError(msg)


@dataclass(frozen=True, slots=True)
class BertSizes:
    """The five sizes every BERT-style ``config.json`` gives."""

    vocab_size: int
    hidden_size: int
    n_layers: int
    n_heads: int
    intermediate_size: int


def bert_sizes(config: Mapping[str, Any], *, where: str) -> dict[str, int]:
    """:class:`BertSizes`' fields read from ``config``, each a positive integer.

    Raises
    ------
    CheckpointError
        A size is missing or not a positive integer.
    """
    names = {
        "vocab_size": "vocab_size",
        "hidden_size": "hidden_size",
        "n_layers": "num_hidden_layers",
        "n_heads": "num_attention_heads",
        "intermediate_size": "intermediate_size",
    }
    return {
        field: positive_int(config, name, where=where) for field, name in names.items()
    }
