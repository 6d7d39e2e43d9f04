"""Compiled (numba) kernels: say when they compile, and where their cache lives.

numba compiles a kernel on its first call and, with ``cache=True``, writes the machine
code to its cache, so later processes load it instead (about 1 s instead of 20-40 s
for the Caduceus kernels). numba looks in the cache before compiling, and only a real
compilation fires its ``numba:compile`` event: :class:`CompileNotice` listens for that
event and logs once, so a user waiting on a first run knows why.

Where numba caches: ``NUMBA_CACHE_DIR`` when set; otherwise ``__pycache__`` beside the
source if writable, else its user-wide cache dir. The CLI sets ``NUMBA_CACHE_DIR`` to
:func:`default_cache_dir` for each command (and so for the worker processes it
starts), so nothing is written into an installed package and a read-only install
reuses its kernels too. This module imports numba only when a notice is watched.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

logger = logging.getLogger(__name__)

COMPILE_MESSAGE = "compiling kernels, once per machine"
CACHE_SUBDIR = ("embedcache", "numba")


def default_cache_dir(*, xdg_cache_home: str | None, home: Path) -> Path:
    """The user cache dir for compiled kernels: ``$XDG_CACHE_HOME/embedcache/numba``.

    Parameters
    ----------
    xdg_cache_home
        The ``XDG_CACHE_HOME`` value, or None. A relative path is ignored, as the XDG
        base directory specification asks.
    home
        The user's home directory; ``~/.cache`` is the fallback base.
    """
    base = (
        Path(xdg_cache_home)
        if xdg_cache_home and Path(xdg_cache_home).is_absolute()
        else home / ".cache"
    )
    return base.joinpath(*CACHE_SUBDIR)


class CompileNotice:
    """Log once when a kernel of ``modules`` is compiled (a cache load stays silent).

    Parameters
    ----------
    modules
        Module names whose kernels count (``__name__`` of the kernel module).
    what
        What is compiled, for the message (e.g. "Caduceus CPU kernels (numba)").
    seconds
        The expected compile time, for the message.
    """

    def __init__(
        self, *, modules: Sequence[str], what: str, seconds: str = "20-40 s"
    ) -> None:
        self.modules = frozenset(modules)
        self.what = what
        self.seconds = seconds
        self.said = False

    def message(self) -> str:
        from numba import config

        where = (
            f"numba's cache {config.CACHE_DIR}"
            if config.CACHE_DIR
            else "numba's cache (set NUMBA_CACHE_DIR to choose where)"
        )
        return (
            f"{self.what}: {COMPILE_MESSAGE}, about {self.seconds}; later runs load "
            f"them from {where}"
        )

    def on_compile(self, dispatcher: Any) -> None:  # noqa: ANN401 (a numba Dispatcher)
        """Called by the listener before numba compiles ``dispatcher``."""
        module = getattr(getattr(dispatcher, "py_func", None), "__module__", None)
        if self.said or module not in self.modules:
            return
        self.said = True
        logger.info("%s", self.message())

    @contextmanager
    def watch(self) -> Iterator[None]:
        """Listen for numba compilations while the block runs."""
        from numba.core import event

        notice = self

        class _Listener(event.Listener):
            def on_start(self, ev: event.Event) -> None:
                notice.on_compile(ev.data.get("dispatcher"))

            def on_end(self, ev: event.Event) -> None:
                pass

        with event.install_listener("numba:compile", _Listener()):
            yield
