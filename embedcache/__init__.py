"""embedcache: cached frozen embeddings of DNA language models, probed on Genomic Benchmarks.

The package, by stage of the data flow (docs/architecture.md; imports only go down):

- ``errors``, ``hashing``, ``specs``: the bottom floor (error types, sequence hashes, keys)
- ``data``: pinned datasets, versions (TOML), seeded stratified draws, sequence files
- ``models``: one module per model family, recognition, the catalogue
- ``store``: the content-addressed embedding store (Zarr on a folder or a bucket)
- ``engine``: hash -> store lookup -> forward the missing -> commit
- ``analysis``: probes, bootstrap and paired statistics, leakage, clusters, curves, layers
- ``report``: tables, figures, sections, rendering and export
- ``extras``: which install extra brings each optional library
- ``cli``: the ``embedcache`` command

The names below are the notebook's API. They load on first use (PEP 562), so
``import embedcache`` stays light: no torch, polars, numpy, zarr or dask.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

try:
    __version__ = version("embedcache")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

if TYPE_CHECKING:
    from embedcache.analysis.evaluation import Evaluation, evaluate
    from embedcache.data.subsets import draw_version
    from embedcache.data.versions import load_version
    from embedcache.engine.api import embed_into_store
    from embedcache.errors import EmbedcacheError
    from embedcache.models import load_adapter
    from embedcache.report.export import export_frame
    from embedcache.report.render import render_report
    from embedcache.store import EmbeddingStore

# public name -> the module that defines it, imported when the name is first read
_LAZY: dict[str, str] = {
    "load_version": "embedcache.data.versions",
    "draw_version": "embedcache.data.subsets",
    "load_adapter": "embedcache.models",
    "EmbeddingStore": "embedcache.store",
    "embed_into_store": "embedcache.engine.api",
    "evaluate": "embedcache.analysis.evaluation",
    "Evaluation": "embedcache.analysis.evaluation",
    "render_report": "embedcache.report.render",
    "export_frame": "embedcache.report.export",
    "EmbedcacheError": "embedcache.errors",
}

__all__ = [
    "EmbedcacheError",
    "EmbeddingStore",
    "Evaluation",
    "__version__",
    "draw_version",
    "embed_into_store",
    "evaluate",
    "export_frame",
    "load_adapter",
    "load_version",
    "render_report",
]


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        msg = f"module 'embedcache' has no attribute {name!r}"
        raise AttributeError(msg)
    try:
        value = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as err:
        from embedcache.extras import missing_extra

        missing = missing_extra(err, what=f"embedcache.{name}")
        if missing is None:
            raise
        raise missing from err
    globals()[name] = value  # later reads skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*__all__, *(k for k in globals() if k.startswith("__"))})
