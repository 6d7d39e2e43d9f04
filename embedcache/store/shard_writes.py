"""Old name of ``run_writes`` that migrate.py still imports this round (see the
end of ``layout``): deleted at the merge, once migrate.py imports the new one."""

from __future__ import annotations

from embedcache.store.run_writes import write_index

__all__ = ["write_index"]
