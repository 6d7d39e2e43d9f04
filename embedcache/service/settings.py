"""What a server runs: models, store, bind, keys and limits, from options or serve.toml.

Also the two start-up refusals the issue asks for: a key file other users can read,
and a non-loopback bind without keys (unless explicitly allowed).
"""

from __future__ import annotations

import ipaddress
import logging
import stat
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embedcache.service.errors import ServeConfigError
from embedcache.service.wire import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_SEQUENCES

logger = logging.getLogger(__name__)

# Queued sequence tokens per model before 429. Larger than the bases a 16 MiB body
# can carry, so with the default limits one request always fits an empty queue.
DEFAULT_MAX_QUEUE_TOKENS = 32 * 2**20
# How long the batcher waits for concurrent requests to join a batch that is not full.
DEFAULT_BATCH_WINDOW_MS = 2.0
DEFAULT_GRACEFUL_TIMEOUT = 30.0

# per-model keys of serve.toml besides the EmbedOptions fields
_MODEL_KEYS = {"name", "model", "revision", "token_budget"}
_SERVER_KEYS = {
    "store",
    "host",
    "port",
    "api_key_file",
    "allow_unauthenticated",
    "ssl_certfile",
    "ssl_keyfile",
    "max_body_bytes",
    "max_sequences",
    "max_queue_tokens",
    "batch_window_ms",
    "graceful_timeout",
    "threads",
}


@dataclass(frozen=True)
class ModelSpec:
    """One served model: its served ``name``, what to load, and its embed options
    (fields of :class:`~embedcache.models.options.EmbedOptions`, as ``embed`` takes)."""

    name: str
    model: str
    revision: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    token_budget: int | None = None


@dataclass(frozen=True)
class ServeSettings:
    """Everything `embedcache serve` runs with."""

    store: str
    models: tuple[ModelSpec, ...]
    store_options: dict[str, str] = field(default_factory=dict, repr=False)
    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    allow_unauthenticated: bool = False
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_sequences: int = DEFAULT_MAX_SEQUENCES
    max_queue_tokens: int = DEFAULT_MAX_QUEUE_TOKENS
    batch_window_ms: float = DEFAULT_BATCH_WINDOW_MS
    graceful_timeout: float = DEFAULT_GRACEFUL_TIMEOUT
    threads: int | None = None

    def __post_init__(self) -> None:
        if not self.models:
            msg = "no model to serve: give --model (repeatable) or [[model]] tables in --config"
            raise ServeConfigError(msg)
        names = [spec.name for spec in self.models]
        doubled = sorted({n for n in names if names.count(n) > 1})
        if doubled:
            msg = (
                f"served names must be distinct, {doubled} appear more than once; "
                "name each model in serve.toml ([[model]] name = ...)"
            )
            raise ServeConfigError(msg)
        for name in ("max_body_bytes", "max_sequences", "max_queue_tokens"):
            if getattr(self, name) < 1:
                msg = f"{name} must be at least 1, got {getattr(self, name)}"
                raise ServeConfigError(msg)
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            msg = "TLS needs both --ssl-certfile and --ssl-keyfile"
            raise ServeConfigError(msg)
        check_bind(
            self.host,
            has_keys=bool(self.api_keys),
            allow_unauthenticated=self.allow_unauthenticated,
        )


def served_name(model: str) -> str:
    """The name clients send for ``model``: a local directory's folder name, else
    the model as given (``kmer-4``, ``owner/name``)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path.resolve().name
    return model


def read_serve_toml(path: Path | str) -> tuple[dict[str, Any], list[ModelSpec]]:
    """The server settings and the ``[[model]]`` tables of a serve.toml.

    Raises
    ------
    ServeConfigError
        The file cannot be read, is not TOML, or names an unknown setting.
    """
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        msg = f"{path}: cannot read the serve config ({err}); fix the file or the path"
        raise ServeConfigError(msg) from err
    tables = data.pop("model", [])
    unknown = sorted(set(data) - _SERVER_KEYS)
    if unknown:
        msg = f"{path}: unknown settings {unknown}; known are {sorted(_SERVER_KEYS)}"
        raise ServeConfigError(msg)
    if not isinstance(tables, list):
        msg = f"{path}: models are [[model]] tables (an array), got {type(tables).__name__}"
        raise ServeConfigError(msg)
    models = []
    for number, table in enumerate(tables, start=1):
        fields = dict(table)
        model = fields.pop("model", None)
        if not isinstance(model, str) or not model:
            msg = f"{path}: [[model]] number {number} has no `model = ...`"
            raise ServeConfigError(msg)
        name = fields.pop("name", None) or served_name(model)
        revision = fields.pop("revision", None)
        budget = fields.pop("token_budget", None)
        options = fields
        if isinstance(options.get("family_options"), dict):
            options["family_options"] = tuple(
                sorted((str(k), str(v)) for k, v in options["family_options"].items())
            )
        models.append(
            ModelSpec(
                name=str(name),
                model=model,
                revision=revision,
                options=options,
                token_budget=budget,
            )
        )
    return data, models


def read_api_keys(path: Path | str) -> tuple[str, ...]:
    """The keys of a key file, one a line (blank lines and ``#`` comments skipped).

    Raises
    ------
    ServeConfigError
        The file is missing, readable or writable by other users, or holds no key.
    """
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except OSError as err:
        msg = f"API key file {path}: {err.strerror}; give an existing file"
        raise ServeConfigError(msg) from err
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        msg = (
            f"API key file {path} is open to other users (mode {stat.filemode(mode)}); "
            f"restrict it with `chmod 600 {path}`"
        )
        raise ServeConfigError(msg)
    lines = (line.strip() for line in path.read_text().splitlines())
    keys = tuple(line for line in lines if line and not line.startswith("#"))
    if not keys:
        msg = f"API key file {path} holds no key; write one key a line"
        raise ServeConfigError(msg)
    return keys


def is_loopback(host: str) -> bool:
    """Whether ``host`` binds only this machine (``localhost``, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, *, has_keys: bool, allow_unauthenticated: bool) -> None:
    """Refuse a non-loopback bind without API keys unless explicitly allowed."""
    if is_loopback(host) or has_keys:
        return
    if allow_unauthenticated:
        logger.warning(
            "serving on %s without API keys: anyone who reaches it may", host
        )
        return
    msg = (
        f"--host {host} is reachable from other machines and no --api-key-file is given; "
        "give one (a file of keys, mode 600), or pass --allow-unauthenticated"
    )
    raise ServeConfigError(msg)


__all__ = [
    "DEFAULT_BATCH_WINDOW_MS",
    "DEFAULT_GRACEFUL_TIMEOUT",
    "DEFAULT_MAX_QUEUE_TOKENS",
    "ModelSpec",
    "ServeSettings",
    "check_bind",
    "is_loopback",
    "read_api_keys",
    "read_serve_toml",
    "served_name",
]
