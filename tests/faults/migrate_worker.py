"""Run ``migrate_store`` and SIGKILL this process at a point between object writes.

A point is the n-th backend operation of one kind on matching paths, counted by
wrapping ``Backend`` here, in the test's subprocess (the package has no hooks for
it); ``op-<n>`` is the n-th operation of any kind that writes or deletes. A run
that reaches its point never returns: the test sees exit status -9. ``count``
runs to the end and prints how many such operations there were.
"""

from __future__ import annotations

import fnmatch
import os
import signal
import sys

from embedcache.store import migrate_store
from embedcache.store.backend import Backend

WRITES = ("write", "create")
DELETES = ("delete", "delete_many", "delete_prefixes")
KEY_DOC = "?" * 64 + "/zarr.json"
# name: (operations counted, path pattern, which one kills)
POINTS = {
    # the first object of the first copy; a few objects into it
    "before-copy": (WRITES, "*/shards/*~v5/*", 1),
    "mid-copy": (WRITES, "*/shards/*~v5/*", 4),
    # the second key copied and published in its log, not flipped (the first is
    # converted and cleaned up)
    "before-flip": (("write",), KEY_DOC, 2),
    # the first key flipped: no claim written, nothing deleted
    "after-flip": (("create",), "*/commits/*~v5/zarr.json", 1),
    # the first key's old records being deleted
    "mid-cleanup": (DELETES, "*", 3),
    # every key converted and cleaned up, the root not flipped
    "before-root": (("write",), "zarr.json", 1),
}


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def kill_at(point: str) -> list[int]:
    """Wrap the backend's writes and deletes so that reaching ``point`` kills the
    process; the count of writes and deletes so far (one number, in a list)."""
    if point.startswith("op-"):
        ops, pattern, nth = (*WRITES, *DELETES), "*", int(point[3:])
    elif point == "count":
        ops, pattern, nth = (*WRITES, *DELETES), "*", 0
    else:
        ops, pattern, nth = POINTS[point]
    seen = [0]

    def wrapped(op: str, real):
        def method(self: Backend, first: object, *args: object, **kwargs: object):
            paths = [first] if isinstance(first, str) else list(first)  # type: ignore[call-overload]
            if op in ops and any(fnmatch.fnmatchcase(p, pattern) for p in paths):
                seen[0] += 1
                if seen[0] == nth:
                    die()
            return real(
                self, first if isinstance(first, str) else paths, *args, **kwargs
            )

        return method

    for op in (*WRITES, *DELETES):
        setattr(Backend, op, wrapped(op, getattr(Backend, op)))
    return seen


def main() -> int:
    store, point = sys.argv[1:3]
    seen = kill_at(point)
    migrate_store(store)
    sys.stdout.write(
        f"finished without reaching the point after {seen[0]} operations\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
