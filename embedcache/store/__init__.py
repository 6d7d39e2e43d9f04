"""Content-addressed embedding store: a Zarr v3 hierarchy on a folder or a bucket.

One group per model key; within it, runs written once by one writer each, claimed
by a commit record and ordered by a log entry, both created with put-if-absent
(``commits``; the protocol: ``docs/store-protocol.md``). The modules, one job each:

- ``backend``: the storage interface over obstore (local, s3, gs, az, memory)
- ``layout``: object names, group documents, commit records (``schema_version`` 5)
- ``groups``: open the location, the root group and the key groups
- a run's objects: ``run_writes`` writes its chunks directly (the bytes zarr
  writes) from rows handed over in pieces; ``run_reads`` reads them (zarr arrays
  with the crc32c codec; ``chunks``: raw chunk reads beside zarr, the same
  check); ``runs``: its sorted index (sorted hashes, rows, fences, Bloom filter)
  and look-ups that read only the blocks that can hold the asked hashes;
  ``index``: sequence hashes as raw sha256 keys
- ``snapshots``: what a reader sees of a key: immutable snapshots of its
  published runs, refreshed from the log every ``refresh_seconds``, quarantine
- ``reads``: look-ups, vectors and hashes read from one snapshot
- ``commits``: the commit protocol (claim, publish in the log, the collector's
  tombstone, retiring runs)
- ``merges``: merges by level after each put, and ``compact``; ``merged_runs``:
  a merge of sorted runs, streamed a bounded step at a time; ``counts``: a key's
  distinct vectors from its records
- ``collection``: fenced garbage collection, runs merged away deleted after a
  grace, quarantined runs dropped (``repair``)
- ``lease``: writer leases, renewed while a writer holds uncommitted runs, and
  what a collector saw of them on its own clock
- ``verify``: full checks; ``migrate``: convert a schema-1 to -4 store
- ``options``: a URL's backend options from its cloud's environment variables
- ``zarr_objects``: zarr's view of the obstore store (blocking calls on worker threads)
- ``retry``: retries of transient object-store errors, and the errors that name them
- ``embedding_store``: :class:`EmbeddingStore`, the public API; ``inputs``: its
  checks of the vectors and alias a caller puts
"""

from __future__ import annotations

from embedcache.store.backend import is_url, open_object_store
from embedcache.store.counts import KeyInfo
from embedcache.store.embedding_store import EmbeddingStore
from embedcache.store.layout import SCHEMA_VERSION
from embedcache.store.lease import LeasePolicy
from embedcache.store.merges import AUTO_MERGE
from embedcache.store.migrate import migrate_store
from embedcache.store.options import storage_options
from embedcache.store.verify import Fault

__all__ = [
    "AUTO_MERGE",
    "SCHEMA_VERSION",
    "EmbeddingStore",
    "Fault",
    "KeyInfo",
    "LeasePolicy",
    "is_url",
    "migrate_store",
    "open_object_store",
    "storage_options",
]
