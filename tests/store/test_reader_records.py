"""A reader keeps of each commit record only what it checks as it opens a run (the
metadata documents, the fences and the filter), not a checksum of every chunk:
a 100 M-row key's records named 116,266 objects, 54 MiB once parsed."""

from __future__ import annotations

import hashlib

import numpy as np

from embedcache.specs import ModelKey
from embedcache.store import EmbeddingStore, runs
from embedcache.store.layout import CommitRecord, record_path

KEY = ModelKey(
    model_id="test/reader-records", revision="0" * 40, adapter="t", adapter_version="1"
)


def test_a_reader_keeps_the_checksums_it_checks_and_the_size_of_the_rest(tmp_path):
    n = 3 * runs.BLOCK_ROWS + 5  # four blocks of sorted hashes: four chunk objects
    hashes = [hashlib.sha256(f"r{i}".encode()).hexdigest() for i in range(n)]
    writer = EmbeddingStore(tmp_path)
    writer.put(KEY, hashes, np.ones((n, 3), np.float32))
    reader = EmbeddingStore(tmp_path)
    got, found = reader.get(KEY, hashes[::-1])
    assert found.all()
    np.testing.assert_array_equal(got, np.ones((n, 3), np.float32))
    chunks = ("sorted_hashes/c/", "sorted_rows/c/", "vectors/c/", "hashes/c/")
    for store in (writer, reader):  # its own commit, and one it listed
        view = store._view(KEY)
        (run,) = view.runs
        path = tmp_path / record_path(view.digest, run.record.run)
        full = CommitRecord.from_doc(
            path.read_bytes(), run=run.record.run, dim=3, where=str(path)
        )
        assert sum(rel.startswith("sorted_hashes/c/") for rel in full.files) == 4
        assert not any(rel.startswith(chunks) for rel in run.record.files)
        assert {"zarr.json", "fences/c/0/0", "bloom/c/0"} <= run.record.files.keys()
        assert {rel: full.files[rel] for rel in run.record.files} == run.record.files
        assert run.record.nbytes() == full.nbytes()
    assert reader.keys()[0].nbytes == full.nbytes()
    assert reader.verify() == []  # from the records in full
