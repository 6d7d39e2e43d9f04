"""Reading a checkpoint's weights and loading them into our own modules, strictly.

A published checkpoint is ``model.safetensors`` or ``pytorch_model.bin``, possibly
sharded behind an ``*.index.json``. Pickles are read with ``weights_only=True`` (a file
from the internet must not run code). Loading is strict both ways: a weight the module
expects but the checkpoint lacks, or one the checkpoint holds that the module has no
place for, is refused, so a checkpoint is never loaded silently into the wrong class.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from embedcache.errors import CheckpointError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from pathlib import Path

    import torch

logger = logging.getLogger(__name__)

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def weight_files(folder: Path) -> list[Path]:
    """The checkpoint files of ``folder``: one file, or every shard an index names.

    Raises
    ------
    CheckpointError
        The folder holds no weights, or an index names a shard that is absent.
    """
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return [folder / name]
    for name in _INDEXES:
        index = folder / name
        if index.is_file():
            shards = sorted(set(_read_json(index).get("weight_map", {}).values()))
            missing = [s for s in shards if not (folder / s).is_file()]
            if missing or not shards:
                msg = (
                    f"{index} names shards that are absent: {missing or 'none listed'}"
                )
                raise CheckpointError(msg)
            return [folder / s for s in shards]
    msg = (
        f"{folder} holds none of {', '.join(WEIGHT_FILES + _INDEXES)}; "
        "save the model with save_pretrained"
    )
    raise CheckpointError(msg)


def weight_names(folder: Path) -> frozenset[str]:
    """Names of the tensors in ``folder``'s checkpoint, read without loading them.

    Safetensors headers and shard indexes are read directly; a single pickle is
    loaded (there is no other way to list it).
    """
    for name in _INDEXES:
        if (folder / name).is_file():
            return frozenset(_read_json(folder / name).get("weight_map", {}))
    files = weight_files(folder)
    if files[0].suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(files[0]), framework="pt") as fh:
            return frozenset(fh.keys())
    return frozenset(read_state_dict(folder))


def header_weight_names(folder: Path) -> frozenset[str]:
    """Tensor names readable without loading tensors (a safetensors header, a shard
    index); empty for a single pickle, which would have to be loaded whole, and for
    a folder whose weights cannot be listed."""
    has_header = (folder / WEIGHT_FILES[0]).is_file() or any(
        (folder / n).is_file() for n in _INDEXES
    )
    if not has_header:
        return frozenset()
    try:
        return weight_names(folder)
    except CheckpointError:
        return frozenset()


def read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of ``folder``'s checkpoint (all shards), on the CPU.

    Raises
    ------
    CheckpointError
        A file cannot be read as safetensors or as a weights-only pickle.
    """
    import torch

    state: dict[str, torch.Tensor] = {}
    for path in weight_files(folder):
        try:
            if path.suffix == ".safetensors":
                from safetensors.torch import load_file

                state.update(load_file(str(path), device="cpu"))
            else:
                state.update(torch.load(path, map_location="cpu", weights_only=True))
        except Exception as err:  # safetensors and pickle raise many types
            msg = f"cannot read the weights in {path}: {err}"
            raise CheckpointError(msg) from err
    return state


def strip_prefix(
    state: Mapping[str, torch.Tensor],
    prefix: str,
    *,
    ignore: Iterable[str] = (),
) -> dict[str, torch.Tensor]:
    """The tensors under ``prefix`` with it removed; tensors under ``ignore`` prefixes
    (heads the embedding never uses, e.g. ``"cls."`` or ``"lm_head."``) are dropped;
    any other tensor is kept under its full name so a strict load refuses it.
    """
    ignore = tuple(ignore)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.startswith(ignore):
            continue
        out[name.removeprefix(prefix) if name.startswith(prefix) else name] = tensor
    return out


def load_strict(
    module: torch.nn.Module,
    state: Mapping[str, torch.Tensor],
    *,
    where: str,
    family: str,
    optional: Iterable[str] = (),
) -> None:
    """Copy ``state`` into ``module``; refuse any missing, unexpected or misshaped tensor.

    Parameters
    ----------
    where
        The checkpoint's location, for messages.
    family
        The family the checkpoint was recognised as, for messages.
    optional
        Module parameter or buffer names the checkpoint may lack (e.g. buffers that
        the published files never stored); they keep their computed value.

    Raises
    ------
    CheckpointError
        Naming up to five missing and unexpected tensors and the family tried.
    """
    own = module.state_dict()
    optional = set(optional)
    missing = sorted(set(own) - set(state) - optional)
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} tensors ({', '.join(missing[:5])})")
        if unexpected:
            parts.append(
                f"{len(unexpected)} unexpected tensors ({', '.join(unexpected[:5])})"
            )
        msg = (
            f"{where} does not fit the {family} architecture its config describes: "
            f"{'; '.join(parts)}. Refusing to load it into the wrong class; check the "
            "checkpoint is complete and is really a " + family + " model."
        )
        raise CheckpointError(msg)
    wrong = [
        f"{name} {tuple(state[name].shape)} vs {tuple(own[name].shape)}"
        for name in own
        if name in state and tuple(state[name].shape) != tuple(own[name].shape)
    ]
    if wrong:
        msg = (
            f"{where}: {len(wrong)} tensors have shapes that do not fit the {family} "
            f"config (checkpoint vs config): {', '.join(wrong[:5])}"
        )
        raise CheckpointError(msg)
    module.load_state_dict(dict(state), strict=False)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        msg = f"cannot read {path}: {err}"
        raise CheckpointError(msg) from err


__all__ = [
    "WEIGHT_FILES",
    "header_weight_names",
    "load_strict",
    "read_state_dict",
    "strip_prefix",
    "weight_files",
    "weight_names",
]
