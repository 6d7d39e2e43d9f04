"""Old names of ``run_reads`` that migrate.py still imports this round (see the
end of ``layout``): deleted at the merge, once migrate.py imports the new ones."""

from __future__ import annotations

from embedcache.store.run_reads import INDEX_ARRAYS, read_keys
from embedcache.store.runs import Run as Shard

__all__ = ["INDEX_ARRAYS", "Shard", "read_keys"]
