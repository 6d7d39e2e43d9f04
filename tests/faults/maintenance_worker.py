"""Run ``compact`` and SIGKILL this process at a named point (a script).

The points are set by wrapping store functions here, in the test's subprocess;
the package has no hooks for it. A run that reaches its point never returns:
the test sees exit status -9.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from embedcache.store import EmbeddingStore, LeasePolicy, merges
from embedcache.store.backend import Backend


def die(*_args: object, **_kwargs: object) -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def is_record(path: str) -> bool:
    """A commit record ``<digest>/commits/<run>/zarr.json`` (not a group doc)."""
    parts = path.split("/")
    return len(parts) >= 4 and parts[-3] == "commits" and parts[-1] == "zarr.json"


def kill_at(point: str) -> None:
    """Wrap the function the point names so that calling it kills the process."""
    create, delete_prefixes = Backend.create, Backend.delete_prefixes

    def create_or_die(self: Backend, path: str, data: bytes) -> bool:
        if is_record(path):
            die()
        return create(self, path, data)

    def delete_or_die(self: Backend, prefixes: object) -> None:
        prefixes = list(prefixes)  # type: ignore[call-overload]
        if prefixes:  # a deletion, not an empty call
            die()
        delete_prefixes(self, prefixes)

    wraps = {
        # compact: before the merged run is written; written, not committed;
        # published, not yet adopted by its writer; the collection after the
        # grace half way through deleting the runs merged away
        "before-write": (merges, "commit_run", die),
        "before-commit": (Backend, "create", create_or_die),
        "after-publish": (merges, "adopt", die),
        "mid-retire": (Backend, "delete_prefixes", delete_or_die),
    }
    owner, name, fn = wraps[point]
    setattr(owner, name, fn)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("op", choices=["compact"])
    parser.add_argument("point")
    parser.add_argument("--options", default=None, help="obstore options as JSON")
    args = parser.parse_args()
    options = json.loads(args.options) if args.options else None
    kill_at(args.point)
    now = [1000.0]  # this process's clock, moved past the grace by hand
    policy = LeasePolicy(clock=lambda: now[0])
    store = EmbeddingStore(args.store, options=options, lease=policy)
    store.compact()
    now[0] += store.refresh_seconds + policy.margin_seconds + 1
    store.collect()  # deletes the runs merged away
    sys.stdout.write("finished without reaching the point\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
