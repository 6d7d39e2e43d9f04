"""Build a module on the meta device and give it CPU storage, without torch's slow paths.

torch runs two calls on meta tensors through Python references that import heavy
modules on first use (torch 2.13, measured with ``python -X importtime``): ``normal_``
(``nn.Embedding``'s init) imports ``torch._dynamo``, about 2 s, and ``empty_like``
(``Module.to_empty``) imports sympy, about 0.6 s; both before any weight is read.
Meta tensors hold no values, so inside :func:`meta_device` a ``normal_`` of one returns
it untouched, and :func:`materialise` allocates with ``empty_strided`` (same shape,
strides and dtype) instead.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch.overrides import TorchFunctionMode

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

# the init calls that reach torch._dynamo on meta tensors (nn.init.normal_ and the
# method it calls)
_SKIPPED = frozenset({torch.Tensor.normal_, torch.nn.init.normal_})


class _MetaShortcuts(TorchFunctionMode):
    """``normal_`` of a meta tensor returns it untouched; ``empty_like`` of one
    allocates with ``empty_strided``. Everything else runs as called."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,  # noqa: ANN401 - torch's signature
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:  # noqa: ANN401
        kwargs = kwargs or {}
        # nn.init.normal_ passes its tensor by keyword, Tensor.normal_ as self
        first = args[0] if args else kwargs.get("tensor")
        if isinstance(first, torch.Tensor) and first.is_meta:
            if func in _SKIPPED:
                return first
            if func is torch.empty_like and set(kwargs) <= {"device"}:
                return torch.empty_strided(
                    first.size(),
                    first.stride(),
                    dtype=first.dtype,
                    device=kwargs.get("device", first.device),
                )
        return func(*args, **kwargs)


def materialise(network: torch.nn.Module, *, device: str = "cpu") -> torch.nn.Module:
    """``network.to_empty(device=device)``: uninitialised storage for every tensor."""
    with _MetaShortcuts():
        return network.to_empty(device=device)


@contextmanager
def meta_device() -> Iterator[None]:
    """Tensors made inside are on the meta device; ``normal_`` on them is skipped."""
    with torch.device("meta"), _MetaShortcuts():
        yield


__all__ = ["materialise", "meta_device"]
