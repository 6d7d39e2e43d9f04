"""Wrap a module's functions for the length of a block (kernels timed or labelled
where the model looks them up), and put the originals back after."""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from types import ModuleType


@contextmanager
def wrapped(
    module: ModuleType,
    names: Sequence[str],
    wrap: Callable[[str, Callable[..., Any]], Callable[..., Any]],
) -> Iterator[None]:
    """``module.<name> = wrap(name, original)`` for each name, inside the block."""
    originals = {name: getattr(module, name) for name in names}
    for name, fn in originals.items():
        setattr(module, name, wrap(name, fn))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(module, name, fn)
