"""A store's backend options for a URL, taken from its cloud's environment variables.

Pure: the caller passes the environment (only the command line reads the process's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

# Per cloud, the standard environment variables handed to the store as options.
STORAGE_ENV = {
    "s3": (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_ENDPOINT_URL",
        "AWS_ALLOW_HTTP",
        "AWS_SKIP_SIGNATURE",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST",
    ),
    "gs": (
        "GOOGLE_SERVICE_ACCOUNT",
        "GOOGLE_SERVICE_ACCOUNT_KEY",
        "GOOGLE_APPLICATION_CREDENTIALS",
    ),
    "az": (
        "AZURE_STORAGE_ACCOUNT_NAME",
        "AZURE_STORAGE_ACCOUNT_KEY",
        "AZURE_STORAGE_SAS_KEY",
        "AZURE_STORAGE_TOKEN",
        "AZURE_STORAGE_USE_EMULATOR",
        "AZURE_ALLOW_HTTP",
    ),
}
_CLOUD_OF_SCHEME = {"s3": "s3", "s3a": "s3", "gs": "gs"} | dict.fromkeys(
    ("az", "abfs", "abfss", "azure", "adl"), "az"
)


def storage_options(location: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The store options for a URL, from its cloud's variables in ``environ``.

    Plain strings: a cluster client can send them with the URL to its workers,
    which open ``EmbeddingStore(location, options=...)`` themselves. A folder (no
    ``scheme://``) gets none.
    """
    cloud = _CLOUD_OF_SCHEME.get(location.partition("://")[0].lower())
    names = STORAGE_ENV.get(cloud, ()) if "://" in location else ()
    return {name.lower(): environ[name] for name in names if environ.get(name)}


__all__ = ["STORAGE_ENV", "storage_options"]
