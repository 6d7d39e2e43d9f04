"""Read stores with an old embedcache (a script run with that version first on the path).

``old_reader.py VERSION STORE...``: in each store, every key of the schema-VERSION
fixture whose group still says schema VERSION is read with the old embedcache and
must serve every fixture row with its vector; a key flipped to schema 5 must be
refused, never misread. Prints ``read <n> refused <m>``. Imports nothing of the
tests: only the old package and the fixture's maker are on the path.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import numpy as np


def main() -> int:
    version, stores = int(sys.argv[1]), sys.argv[2:]
    from embedcache.errors import StoreError
    from embedcache.store import EmbeddingStore

    rows = importlib.import_module(f"make_store_schema{version}").expected()
    read = refused = 0
    for root in stores:
        store = EmbeddingStore(root, create=False)
        for key, (hashes, vectors) in rows.items():
            doc = json.loads((Path(root) / key.digest / "zarr.json").read_bytes())
            if doc["attributes"]["embedcache"]["schema_version"] != version:
                try:
                    store.get(key, hashes)
                except StoreError:
                    refused += 1
                    continue
                sys.stdout.write(f"{root}: a flipped key was read\n")
                return 1
            got, found = store.get(key, hashes)
            if not found.all() or not np.array_equal(got, vectors):
                sys.stdout.write(f"{root}: {key.short()} did not read back\n")
                return 1
            read += 1
    sys.stdout.write(f"read {read} refused {refused}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
