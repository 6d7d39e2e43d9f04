"""What every family does the same way when it loads a checkpoint folder.

:class:`Source` is what :func:`embedcache.models.load_adapter` hands a family's
``load``: the folder, its config and everything the key records about it. Reading ``tokenizer_config.json`` and an ``auto_map``, refusing options that do not
apply, the compute dtype, building a module without its own init, and filling it with
either the checkpoint's weights (strictly) or the family's seeded random init, which
gives a random-init twin its own revision and records the config it was built from.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from embedcache.errors import AdapterOptionError, CheckpointError
from embedcache.models.options import non_default, random_init_revision

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    import torch

    from embedcache.models.options import EmbedOptions

TOKENIZER_CONFIG = "tokenizer_config.json"

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Source:
    """A resolved checkpoint and how to load it.

    Parameters
    ----------
    folder, config
        The hub-layout folder and its ``config.json``.
    model_id, revision
        What the key records: the hub id (or ``local``) and the commit sha or
        content digest (a random-init twin's own revision, once built).
    options, device
        The embedding options and the resolved device.
    alias
        A local folder's name, shown beside the key.
    """

    folder: Path
    config: dict[str, Any]
    model_id: str
    revision: str
    options: EmbedOptions
    device: str
    alias: str | None = None

    @property
    def where(self) -> str:
        """The model's name in messages: its alias, else its model id."""
        return str(self.alias or self.model_id)


def config_digest(config: Mapping[str, object]) -> str:
    """sha256 of a config's canonical JSON: names a random-init twin's architecture."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def random_init_twin(source: Source) -> tuple[Source, tuple[str, str]]:
    """``source`` with a random-init twin's revision (``options.random_init`` is its
    seed), and the key option naming the architecture it was built from."""
    seed = source.options.random_init
    if seed is None:
        msg = f"{source.where}: no --random-init seed was given"
        raise AdapterOptionError(msg)
    twin = replace(source, revision=random_init_revision(seed))
    return twin, ("config", config_digest(source.config))


def refuse_options(
    options: EmbedOptions, names: tuple[str, ...], *, before: str, after: str = ""
) -> None:
    """Raise naming the flags among ``names`` that ``options`` sets: ``before`` and
    ``after`` go either side of the list.

    Raises
    ------
    AdapterOptionError
        One of the options is set away from its default.
    """
    flags = non_default(options, names)
    if flags:
        msg = f"{before}{', '.join(flags)}{after}"
        raise AdapterOptionError(msg)


def read_encoder_arch(
    source: Source, arch_from_config: Callable[..., T], *, family: str, label: str
) -> T:
    """The architecture in ``source``'s config.json, once the options a BERT-style
    encoder cannot take (``kmer_split``, ``family_options``) are refused.

    Raises
    ------
    AdapterOptionError
        One of those options is set.
    CheckpointError
        The config does not describe the family (from ``arch_from_config``).
    """
    refuse_options(
        source.options,
        ("kmer_split", "family_options"),
        before=f"{source.where} ({family}): ",
        after=f" do(es) not apply to {label}",
    )
    return arch_from_config(source.config, where=f"{source.folder}/config.json")


def compute_dtype(options: EmbedOptions) -> torch.dtype:
    """The torch dtype ``options.dtype`` names."""
    import torch

    return torch.bfloat16 if options.dtype == "bfloat16" else torch.float32


def auto_map_targets(config: Mapping[str, Any]) -> list[str]:
    """The ``module.Class`` names an ``auto_map`` points at (``repo--`` prefixes dropped)."""
    auto_map = config.get("auto_map")
    if not isinstance(auto_map, dict):
        return []
    targets = []
    for value in auto_map.values():
        for ref in value if isinstance(value, list | tuple) else [value]:
            if isinstance(ref, str):
                targets.append(ref.split("--")[-1])
    return targets


def read_json_object(path: Path) -> dict[str, Any] | None:
    """A JSON file's object; None when the file is absent or holds no object.

    Raises
    ------
    CheckpointError
        The file exists but cannot be read as JSON.
    """
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        msg = f"cannot read {path}: {err}"
        raise CheckpointError(msg) from err
    return value if isinstance(value, dict) else None


def check_tokenizer_class(folder: Path, allowed: str, *, where: str, uses: str) -> None:
    """Refuse a ``tokenizer_config.json`` naming a class other than ``allowed``
    (none named is fine); ``uses`` says what the family's checkpoints use.

    Raises
    ------
    CheckpointError
        The file cannot be read, or it names another tokenizer class.
    """
    path = folder / TOKENIZER_CONFIG
    if not path.is_file():
        return
    try:
        declared = json.loads(path.read_text(encoding="utf-8")).get("tokenizer_class")
    except (OSError, json.JSONDecodeError, AttributeError) as err:
        msg = f"cannot read {path}: {err}"
        raise CheckpointError(msg) from err
    if declared not in (None, allowed):
        msg = f"{where}: {TOKENIZER_CONFIG} names {declared!r}; {uses}"
        raise CheckpointError(msg)


def empty_module(build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """``build()`` on the meta device, then given CPU storage: its own random init is
    skipped (the checkpoint's weights or the family's seeded init replace it)."""
    from embedcache.models.shared.meta_init import materialise, meta_device

    with meta_device():
        network = build()
    return materialise(network, device="cpu")


def fill_weights(
    network: torch.nn.Module,
    source: Source,
    *,
    init: Callable[[torch.nn.Module, int], None],
    state: Callable[[dict[str, torch.Tensor]], Mapping[str, torch.Tensor]],
    family: str,
) -> tuple[Source, list[tuple[str, str]]]:
    """The family's seeded init (``--random-init``) or the checkpoint's tensors,
    renamed by ``state`` and loaded strictly; return the source as the key records
    it and the key's options.

    Raises
    ------
    CheckpointError
        The checkpoint cannot be read or does not fit ``network``.
    """
    from embedcache.models.shared.weights import load_strict, read_state_dict

    seed = source.options.random_init
    if seed is not None:
        init(network, seed)
        twin, option = random_init_twin(source)
        return twin, [option]
    tensors = state(read_state_dict(source.folder))
    load_strict(network, tensors, where=str(source.folder), family=family)
    return source, []


def refuse_larger_vocab(where: str, file: str, n_tokens: int, vocab_size: int) -> None:
    """Refuse a tokenizer with more tokens than the model's embedding table has rows
    (an id past the table would index out of it)."""
    if n_tokens > vocab_size:
        msg = (
            f"{where}: {file} has {n_tokens} tokens but the model's vocab_size is "
            f"{vocab_size}"
        )
        raise CheckpointError(msg)


def build_filled(
    build: Callable[[], torch.nn.Module],
    source: Source,
    *,
    init: Callable[[torch.nn.Module, int], None],
    state: Callable[[dict[str, torch.Tensor]], Mapping[str, torch.Tensor]],
    family: str,
) -> tuple[torch.nn.Module, Source, list[tuple[str, str]]]:
    """:func:`empty_module` of ``build`` filled by :func:`fill_weights`, on the
    source's device in the options' compute dtype, in eval mode; with the source and
    key options :func:`fill_weights` returns.

    Raises
    ------
    CheckpointError
        The checkpoint cannot be read or does not fit the network.
    """
    dtype = compute_dtype(source.options)
    network = empty_module(build)
    source, key_options = fill_weights(
        network, source, init=init, state=state, family=family
    )
    network = network.to(device=source.device, dtype=dtype).eval()
    return network, source, key_options


__all__ = [
    "TOKENIZER_CONFIG",
    "Source",
    "auto_map_targets",
    "build_filled",
    "check_tokenizer_class",
    "compute_dtype",
    "config_digest",
    "empty_module",
    "fill_weights",
    "random_init_twin",
    "read_json_object",
    "refuse_larger_vocab",
    "refuse_options",
]
