"""`embedcache serve` with faults switched on and off by flag files, as an operator
injects them into a running server: the k-mer model's forward or the store's calls
fail (or stall) while a file of that name exists in ``$FAULTY_SERVE_DIR``.

- ``forward``: every forward pass raises RuntimeError with the file's text (a
  device fault; "CUDA error: an illegal memory access ..." is a sticky one);
- ``forward-slow``: every forward pass sleeps the file's number of seconds first;
- ``put-denied``: every commit raises obstore's PermissionDeniedError (an S3 403);
- ``contains-slow``: every look-up sleeps the file's number of seconds first;
- ``corrupt``: every look-up raises CorruptStoreError.

Run as ``python -m tests.service.faulty_serve serve ...`` (the CLI's arguments).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from embedcache.cli import main
from embedcache.errors import CorruptStoreError
from embedcache.models.floors.kmer import KmerAdapter
from embedcache.store import EmbeddingStore

ENV = "FAULTY_SERVE_DIR"


def _flag(name: str) -> str | None:
    path = Path(os.environ[ENV]) / name
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def _forward(real):
    def embed(self, seqs):
        slow = _flag("forward-slow")
        if slow is not None:
            time.sleep(float(slow))
        text = _flag("forward")
        if text is not None:
            raise RuntimeError(text or "the device failed")
        return real(self, seqs)

    return embed


def _put(real):
    def put(self, *args, **kwargs):
        if _flag("put-denied") is not None:
            import obstore.exceptions

            msg = "403 Forbidden: the security token included in the request is expired"
            raise obstore.exceptions.PermissionDeniedError(msg)
        return real(self, *args, **kwargs)

    return put


def _contains(real):
    def contains(self, *args, **kwargs):
        slow = _flag("contains-slow")
        if slow is not None:
            time.sleep(float(slow))
        if _flag("corrupt") is not None:
            msg = "chunk 3 of the run fails its checksum"
            raise CorruptStoreError(msg)
        return real(self, *args, **kwargs)

    return contains


if __name__ == "__main__":
    KmerAdapter.embed_batch = _forward(KmerAdapter.embed_batch)
    EmbeddingStore.put = _put(EmbeddingStore.put)
    EmbeddingStore.contains = _contains(EmbeddingStore.contains)
    sys.exit(main(sys.argv[1:]))
