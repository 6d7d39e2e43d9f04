"""What a server runs, declared once: :class:`ServeSettings`, from flags,
``EMBEDCACHE_*`` environment variables and serve.toml, in that precedence (the
deployment convention: a container's environment overrides the file baked into its
image), over its defaults.

Every setting is one typed field with its default and its help: `embedcache serve`
makes its flags from the fields (:func:`setting_flags`), ``serve.toml`` may name
any of them (and ``[[model]]`` tables, :class:`ModelTable`), ``EMBEDCACHE_<NAME>``
sets one from the environment. Values from flags and serve.toml are strict (a
boolean is a boolean: ``"false"`` is refused, not taken as true); an environment
variable is text, read as its field's type. Unknown keys are errors, in the file
and in the environment alike (an ``EMBEDCACHE_`` variable that is neither a setting
nor one of :data:`OTHER_VARIABLES`). A bad setting is one line naming it and where
it came from (:class:`ServeConfigError`, exit 2).

Also the start-up refusals: a key file other users can read, and a non-loopback
bind without keys (unless explicitly allowed).
"""

from __future__ import annotations

import difflib
import tomllib
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from embedcache.models.shared import cpu_features, tuning
from embedcache.service.access import check_bind, read_api_keys
from embedcache.service.errors import ServeConfigError
from embedcache.service.wire import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_SEQUENCES

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pydantic.fields import FieldInfo


ENV_PREFIX = "EMBEDCACHE_"
# variables of the other commands a server's environment may hold too, and the
# process-wide switches the models read (the kernel tuner's override; the CPU kind
# forced for tests)
OTHER_VARIABLES = frozenset(
    {
        "EMBEDCACHE_API_KEY",
        "EMBEDCACHE_SERVER",
        "EMBEDCACHE_CLUSTER",
        "EMBEDCACHE_DATA_DIR",
        tuning.ENV_VAR,
        cpu_features.FORCED_KIND_VAR,
    }
)


@dataclass(frozen=True)
class ModelSpec:
    """One served model: its served ``name``, what to load, and its embed options
    (fields of :class:`~embedcache.models.options.EmbedOptions`, as ``embed`` takes)."""

    name: str
    model: str
    revision: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    token_budget: int | None = None


class ModelTable(BaseModel):
    """One ``[[model]]`` table of serve.toml: what to load, its served name, and the
    options of `embed` (those not given keep `embed`'s defaults)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    model: str = Field(min_length=1)
    name: str | None = None
    revision: str | None = None
    token_budget: int | None = Field(default=None, ge=1)
    dtype: str | None = None
    device: str | None = None
    rc_mode: str | None = None
    layers: str | list[int] | None = None
    layer: int | None = None
    pooling: str | None = None
    special_tokens: str | None = None
    truncation: str | None = None
    kmer_split: int | None = Field(default=None, ge=1)
    random_init: int | None = None
    family_options: dict[str, str | int | float | bool] | None = None
    trust_remote_code: bool | None = None

    def spec(self) -> ModelSpec:
        """The served model this table declares."""
        options = self.model_dump(
            exclude_none=True, exclude={"model", "name", "revision", "token_budget"}
        )
        if "family_options" in options:
            options["family_options"] = tuple(
                sorted((k, str(v)) for k, v in options["family_options"].items())
            )
        return ModelSpec(
            name=self.name or served_name(self.model),
            model=self.model,
            revision=self.revision,
            options=options,
            token_budget=self.token_budget,
        )


# the environment and serve.toml load_settings reads (the CLI hands it the process
# environment)
_ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("environ", default=None)
_FILE: ContextVar[Mapping[str, Any] | None] = ContextVar("file", default=None)


def env_name(setting: str) -> str:
    """The variable that sets ``setting``: ``EMBEDCACHE_<SETTING>``."""
    return f"{ENV_PREFIX}{setting.upper()}"


class _EnvSource(PydanticBaseSettingsSource):
    """``EMBEDCACHE_*`` variables, text read as their field's type (the model itself
    is strict: a text "false" from serve.toml is refused)."""

    def get_field_value(
        self, field: FieldInfo, field_name: str
    ) -> tuple[str | None, str, bool]:
        environ = _ENVIRON.get() or {}
        return environ.get(env_name(field_name)), field_name, False

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name, info in self.settings_cls.model_fields.items():
            text, _, _ = self.get_field_value(info, name)
            if text is None:
                continue
            adapter = TypeAdapter(info.annotation)
            try:
                values[name] = (
                    adapter.validate_json(text)
                    if name == "model"
                    else adapter.validate_strings(text)
                )
            except ValidationError:
                values[name] = text  # the strict check names it
        return values


class _FileSource(PydanticBaseSettingsSource):
    """serve.toml's values as written (strict: its types are TOML's)."""

    def get_field_value(
        self, field: FieldInfo, field_name: str
    ) -> tuple[Any, str, bool]:
        return (_FILE.get() or {}).get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_FILE.get() or {})  # unknown keys too: the model refuses them


class ServeSettings(BaseSettings):
    """Everything `embedcache serve` runs with. Build it with :func:`load_settings`."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="forbid", strict=True, frozen=True
    )

    store: str = Field(
        default="store",
        description="embedding store: a folder or s3://, gs://, az:// URL",
    )
    model: list[ModelTable] = Field(
        default_factory=list, description="serve.toml's [[model]] tables"
    )
    host: str = Field(default="127.0.0.1", description="address to bind")
    port: int = Field(default=8000, ge=0, le=65535, description="port")
    metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="also serve /metrics on this port (on --host, without API keys), "
        "from a thread of its own: it answers while the server is busy",
    )
    api_key_file: str | None = Field(
        default=None,
        description="keys clients send as `Authorization: Bearer KEY`, one a line; mode 600",
    )
    allow_unauthenticated: bool = Field(
        default=False, description="allow a non-loopback --host without --api-key-file"
    )
    ssl_certfile: str | None = Field(
        default=None, description="TLS certificate (PEM), passed to uvicorn"
    )
    ssl_keyfile: str | None = Field(
        default=None, description="TLS private key (PEM), passed to uvicorn"
    )
    max_body_bytes: int = Field(
        default=DEFAULT_MAX_BODY_BYTES, ge=1, description="request body limit, bytes"
    )
    max_sequences: int = Field(
        default=DEFAULT_MAX_SEQUENCES, ge=1, description="sequences per request"
    )
    # larger than the bases a 16 MiB body can carry: one request always fits
    max_queue_tokens: int = Field(
        default=32 * 2**20, ge=1, description="queued tokens per model before 429"
    )
    batch_window_ms: float = Field(
        default=2.0,
        ge=0,
        le=10_000,
        description="how long a batch that is not full waits for other requests, ms",
    )
    graceful_timeout: float = Field(
        default=30.0, gt=0, description="seconds to drain on SIGTERM/SIGINT"
    )
    request_timeout: float = Field(
        default=300.0,
        gt=0,
        description="seconds a request may take; past it 504 and its queued work is dropped",
    )
    threads: int | None = Field(default=None, ge=1, description="torch CPU threads")
    limit_concurrency: int = Field(
        default=512,
        ge=1,
        description="requests at once, health and metrics excepted (idle connections do not count); beyond it 429",
    )
    # read deadlines: a socket that never finishes a request is closed, holding nothing
    header_timeout: float = Field(
        default=10.0,
        gt=0,
        description="seconds to send a request's headers, from connecting or from the first byte after a keep-alive",
    )
    body_timeout: float = Field(
        default=60.0, gt=0, description="seconds a request's body may take to arrive"
    )
    keep_alive_timeout: float = Field(
        default=5.0,
        gt=0,
        description="seconds an idle keep-alive connection stays open (a balancer's should be shorter)",
    )
    max_buffered_bytes: int = Field(
        default=256 * 2**20,
        ge=1,
        description="request body bytes held by all requests at once; beyond it 503",
    )
    store_probe_seconds: float = Field(
        default=2.0,
        gt=0,
        le=3600,
        description="how often /health/ready reads the store to check it answers, s",
    )
    refresh_seconds: float | None = Field(
        default=None,
        ge=0,
        description="how stale the store's view of other writers' commits may be, "
        "s (none: the store's own)",
    )

    # the service's fault handling: docs/serving-faults.md
    worker_threads: int = Field(
        default=32, ge=1, description="request worker threads, abandoned too; then 503"
    )
    breaker_failures: int = Field(
        default=3, ge=1, le=100, description="failed batches in a row before not ready"
    )
    breaker_probe_seconds: float = Field(
        default=5.0, gt=0, le=3600, description="a not-ready model's canary interval, s"
    )
    stall_seconds: float = Field(
        default=600.0, gt=0, description="a pass running longer fails /health/live, s"
    )

    _api_keys: tuple[str, ...] = PrivateAttr(default=())
    _models: tuple[ModelSpec, ...] = PrivateAttr(default=())
    _store_options: dict[str, str] = PrivateAttr(default_factory=dict)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # flags (the init values), then the environment, then serve.toml; no .env
        # or secrets files
        return init_settings, _EnvSource(settings_cls), _FileSource(settings_cls)

    @property
    def api_keys(self) -> tuple[str, ...]:
        return self._api_keys

    @property
    def models(self) -> tuple[ModelSpec, ...]:
        """Every served model: serve.toml's tables, then the ``--model`` flags'."""
        return self._models

    @property
    def store_options(self) -> dict[str, str]:
        return self._store_options


SERVER_SETTINGS = tuple(name for name in ServeSettings.model_fields if name != "model")


def load_settings(
    flags: Mapping[str, Any],
    *,
    config: Path | None = None,
    models: tuple[ModelSpec, ...] = (),
    environ: Mapping[str, str],
) -> ServeSettings:
    """The settings from ``flags`` (the given ones), ``config`` and ``environ``.

    Raises
    ------
    ServeConfigError
        A setting is unknown, of the wrong type or out of range (one line each,
        naming it and its source); no model to serve or one name twice; a key file
        other users can read; a public bind without keys.
    """
    from embedcache.store.options import storage_options

    given = {name: value for name, value in flags.items() if value is not None}
    from_file = read_serve_toml(config) if config is not None else {}
    check_environment(environ)
    reading, reading_file = _ENVIRON.set(environ), _FILE.set(from_file)
    try:
        settings = ServeSettings(**given)
    except ValidationError as err:
        lines = [_describe(e, given, from_file, config, environ) for e in err.errors()]
        raise ServeConfigError("\n".join(lines)) from None
    finally:
        _ENVIRON.reset(reading)
        _FILE.reset(reading_file)
    specs = tuple(table.spec() for table in settings.model) + tuple(models)
    _check_models(specs)
    if bool(settings.ssl_certfile) != bool(settings.ssl_keyfile):
        msg = "TLS needs both --ssl-certfile and --ssl-keyfile"
        raise ServeConfigError(msg)
    keys = read_api_keys(settings.api_key_file) if settings.api_key_file else ()
    check_bind(
        settings.host,
        has_keys=bool(keys),
        allow_unauthenticated=settings.allow_unauthenticated,
    )
    settings._api_keys = keys
    settings._models = specs
    settings._store_options = storage_options(settings.store, environ)
    return settings


def _describe(
    error: Mapping[str, Any],
    flags: Mapping[str, Any],
    from_file: Mapping[str, Any],
    config: Path | None,
    environ: Mapping[str, str],
) -> str:
    """One line: where the bad setting came from, its name, what is wrong."""
    loc = [str(part) for part in error.get("loc", ())]
    name = loc[0] if loc else "?"
    if name in flags:
        where = f"--{name.replace('_', '-')}"
    elif env_name(name) in environ:
        where = f"${env_name(name)}"
    elif name in from_file:
        where = f"{config}: {name}"
        if name == "model" and len(loc) > 2:  # [[model]] number, then its key
            where = f"{config}: [[model]] number {int(loc[1]) + 1}: {'.'.join(loc[2:])}"
    else:
        where = name
    message = error.get("msg", "invalid")
    if error.get("type") == "extra_forbidden":
        table = ModelTable if name == "model" else ServeSettings
        message = f"unknown setting; known are {sorted(table.model_fields)}"
    elif "input" in error and not isinstance(error["input"], dict | list | tuple):
        message = f"{message}, got {error['input']!r}"
    return f"{where}: {message}"


def check_environment(environ: Mapping[str, str]) -> None:
    """Refuse an ``EMBEDCACHE_`` variable that sets nothing, as an unknown key of
    serve.toml is refused: a mistyped ``EMBEDCACHE_MAX_SEQUNCES`` would otherwise
    leave the default in force, unnoticed.

    Raises
    ------
    ServeConfigError
        One line a variable: its name, the nearest setting's variable, the fix.
    """
    known = {env_name(name) for name in ServeSettings.model_fields} | OTHER_VARIABLES
    unknown = sorted(
        name for name in environ if name.startswith(ENV_PREFIX) and name not in known
    )
    lines = []
    for name in unknown:
        near = difflib.get_close_matches(name, sorted(known), n=1)
        hint = f"did you mean ${near[0]}? " if near else ""
        lines.append(
            f"${name}: unknown setting; {hint}unset it, or use one of "
            f"{ENV_PREFIX}<SETTING> for the settings of `embedcache serve --help`"
        )
    if lines:
        raise ServeConfigError("\n".join(lines))


def _check_models(specs: tuple[ModelSpec, ...]) -> None:
    if not specs:
        msg = "no model to serve: give --model (repeatable) or [[model]] tables in --config"
        raise ServeConfigError(msg)
    names = [spec.name for spec in specs]
    doubled = sorted({n for n in names if names.count(n) > 1})
    if doubled:
        msg = (
            f"served names must be distinct, {doubled} appear more than once; "
            "name each model in serve.toml ([[model]] name = ...)"
        )
        raise ServeConfigError(msg)


def served_name(model: str) -> str:
    """The name clients send for ``model``: a local directory's folder name, else
    the model as given (``kmer-4``, ``owner/name``)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path.resolve().name
    return model


def read_serve_toml(path: Path | str) -> dict[str, Any]:
    """The settings of a serve.toml as written (checked by :class:`ServeSettings`).

    Raises
    ------
    ServeConfigError
        The file cannot be read or is not TOML.
    """
    path = Path(path)
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        msg = f"{path}: cannot read the serve config ({err}); fix the file or the path"
        raise ServeConfigError(msg) from err


__all__ = [
    "OTHER_VARIABLES",
    "SERVER_SETTINGS",
    "ModelSpec",
    "ModelTable",
    "ServeSettings",
    "check_environment",
    "load_settings",
    "read_serve_toml",
    "served_name",
]
