"""Which install extra brings each optional library, and the error a missing one raises.

embedcache installs by role (pyproject.toml): a small core, and ``models``, ``serve``,
``cluster``, ``report``, ``notebooks`` and ``client`` on top. When an optional library
is missing, the import fails deep inside a command; :func:`missing_extra` turns that
``ModuleNotFoundError`` into one line naming the extra that brings it, so the command
line and the notebook API say ``pip install 'embedcache[report]'`` instead of showing
a traceback. ``tests/test_extras.py`` checks this table against pyproject's extras.
"""

from __future__ import annotations

from embedcache.errors import EmbedcacheError

# top-level module -> the extra whose packages bring it
EXTRA_OF_MODULE: dict[str, str] = {
    "torch": "models",
    "transformers": "models",
    "tokenizers": "models",
    "safetensors": "models",
    "llvmlite": "models",
    "fastapi": "serve",
    "starlette": "serve",
    "anyio": "serve",
    "pydantic": "serve",
    "pydantic_settings": "serve",
    "uvicorn": "serve",
    "prometheus_client": "serve",
    "orjson": "serve",
    "distributed": "cluster",
    "dask": "cluster",
    "sklearn": "report",
    "scipy": "report",
    "threadpoolctl": "report",
    "matplotlib": "report",
    "papermill": "report",
    "nbconvert": "report",
    "nbformat": "report",
    "jinja2": "report",
    "jupytext": "report",
    # numba compiles both the models' kernels and the leakage audit's; either extra
    # brings it, and the report's is the smaller to name
    "numba": "report",
    "httpx": "client",
    "pyarrow": "client",  # the Arrow replies; the server writes them too
}


class MissingExtraError(EmbedcacheError, ImportError):
    """An optional library is not installed; the message names the extra to install."""


def missing_extra(err: ModuleNotFoundError, *, what: str) -> MissingExtraError | None:
    """The one-line error for ``err`` while running ``what``, or None if no extra has it.

    Parameters
    ----------
    err
        The failed import (``err.name`` is the missing module).
    what
        What needed it, as the user named it (``"embedcache report"``).

    Returns
    -------
    MissingExtraError or None
        None when the missing module is not an optional library of ours (a bug or
        a broken install, which should show its traceback).
    """
    top = (err.name or "").split(".")[0]
    extra = EXTRA_OF_MODULE.get(top)
    if extra is None:
        return None
    msg = (
        f"{what} needs {top}, which is not installed; "
        f"install it with: pip install 'embedcache[{extra}]'"
    )
    return MissingExtraError(msg, name=top)
