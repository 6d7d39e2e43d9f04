"""The one embedding call: options, the in-process path, files, versions, `.npy`."""

from __future__ import annotations

import numpy as np
import pytest

from embedcache.data.subsets import draw_version
from embedcache.data.versions import load_version
from embedcache.engine.api import (
    embed_file,
    embed_into_store,
    embed_options,
    embed_version,
    wants_cluster,
    write_npy,
)
from embedcache.engine.local import embed_sequences
from embedcache.errors import AdapterOptionError, InputFileError
from embedcache.hashing import sequence_key
from embedcache.models import load_adapter
from embedcache.models.options import EmbedOptions
from embedcache.store import EmbeddingStore
from tests.engine.helpers import MemoryStore, random_seqs, write_small_version


def test_wants_cluster_only_for_a_spec_or_a_client():
    for local in (None, "", "none", " None "):
        assert not wants_cluster(local)
    for spec in ("local:2", "tcp://10.0.0.1:8786", " ", object()):
        assert wants_cluster(spec)  # a blank spec is refused by parse_cluster


def test_options_from_fields_as_the_command_line_gives_them():
    assert embed_options("kmer-2") == EmbedOptions()
    given = EmbedOptions(dtype="bfloat16")
    assert embed_options("kmer-2", given) is given
    assert embed_options("m", {"layers": "2,6,12"}).layers == (2, 6, 12)
    assert embed_options("m", {"layer": 3}).layers == (3,)
    assert embed_options("m", {"layers": (1, 2)}).layers == (1, 2)
    assert embed_options("caduceus-tiny", {"layers": "all"}).layers == (-1, 0, 1, 2)
    with pytest.raises(AdapterOptionError, match="give --layer or --layers, not both"):
        embed_options("m", {"layers": "all", "layer": 2})
    with pytest.raises(AdapterOptionError, match="give --layer or --layers, not both"):
        embed_options("m", {"layers": (1,), "layer": 2})
    with pytest.raises(AdapterOptionError, match="without layers"):
        embed_options("kmer-2", {"layers": "all"})
    with pytest.raises(AdapterOptionError, match=r"m: .*colour"):
        embed_options("m", {"colour": "red"})


def test_in_process_into_a_store_location_then_cached(tmp_path):
    seqs = random_seqs(15, seed=7)
    store = tmp_path / "store"
    first = embed_into_store("kmer-3", seqs, store, options={"rc_mode": "average"})
    adapter = load_adapter("kmer-3", rc_mode="average")
    direct = embed_sequences(adapter, seqs, MemoryStore())
    np.testing.assert_array_equal(first.vectors, direct.vectors)
    assert (first.n_computed, first.n_cached) == (15, 0)
    assert first.keys == (adapter.key,)
    again = embed_into_store(
        "kmer-3", seqs, EmbeddingStore(store), options=EmbedOptions(rc_mode="average")
    )
    assert (again.n_computed, again.n_cached) == (0, 15)
    np.testing.assert_array_equal(again.vectors, first.vectors)


def test_a_layer_sweep_names_every_key_filled(tiny_bert_dir, tmp_path):
    result = embed_into_store(
        str(tiny_bert_dir),
        ["ACGTACGT", "GGCC"],
        tmp_path / "s",
        options={"device": "cpu", "layers": "2,0"},
    )
    assert [key.layer for key in result.keys] == [2, 0]
    hashes = [sequence_key(s) for s in ("ACGTACGT", "GGCC")]
    stored, found = EmbeddingStore(tmp_path / "s").get(result.keys[0], hashes)
    assert found.all()
    np.testing.assert_array_equal(stored, result.vectors)


def test_embed_file_names_lines_and_writes_npy(tmp_path):
    (tmp_path / "in.txt").write_text("ACGT\nGATTACA\nACGT\n")
    out = tmp_path / "deep" / "o.npy"
    result = embed_file(tmp_path / "in.txt", "kmer-2", tmp_path / "s", output=out)
    assert (result.n_computed, result.n_cached) == (2, 1)
    np.testing.assert_array_equal(np.load(out), result.vectors)
    assert sorted(p.name for p in out.parent.iterdir()) == ["o.npy"]
    (tmp_path / "bad.txt").write_text("ACGT\nACXT\n")
    with pytest.raises(Exception, match="line 2: invalid character 'X'"):
        embed_file(tmp_path / "bad.txt", "kmer-2", tmp_path / "s")
    with pytest.raises(InputFileError):
        embed_file(tmp_path / "absent.txt", "kmer-2", tmp_path / "s")


def test_embed_version_returns_the_subset_and_its_rows(tmp_path):
    version = write_small_version(tmp_path / "small-demo.toml")
    subset, result = embed_version(version, "kmer-2", tmp_path / "s")
    expected = draw_version(load_version(version))
    assert subset.subset_id == expected.subset_id
    assert result.vectors.shape == (expected.items.height, 16)
    direct = embed_sequences(
        load_adapter("kmer-2"), expected.items["seq"].to_list(), MemoryStore()
    )
    np.testing.assert_array_equal(result.vectors, direct.vectors)
    again_subset, cached = embed_version(
        load_version(version), "kmer-2", tmp_path / "s"
    )
    assert cached.n_computed == 0
    assert again_subset.subset_id == subset.subset_id


def test_write_npy_replaces_whole_files(tmp_path):
    path = tmp_path / "a.npy"
    write_npy(path, np.ones((2, 3), dtype=np.float32))
    write_npy(path, np.zeros((4, 3), dtype=np.float32))
    assert np.load(path).shape == (4, 3)
    assert [p.name for p in tmp_path.iterdir()] == ["a.npy"]
