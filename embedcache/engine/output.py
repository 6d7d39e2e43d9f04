"""The ``.npy`` file an embedding command writes, atomically.

Light on purpose (numpy only): the client writes its vectors through it too, without
the engine's model and cluster imports.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def write_npy(path: Path | str, array: np.ndarray) -> Path:
    """Write ``array`` as ``.npy`` atomically: a reader sees the old file or the new."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as fh:
            np.save(fh, array)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
