"""Who may reach a server: its API keys, read from a file only its owner can read,
and the refusal to listen beyond this machine without them."""

from __future__ import annotations

import ipaddress
import logging
import stat
from pathlib import Path

from embedcache.service.errors import ServeConfigError

logger = logging.getLogger(__name__)


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
