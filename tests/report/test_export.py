from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pytest

from embedcache.cli import main
from embedcache.data.subsets import draw_version
from embedcache.data.versions import load_version
from embedcache.errors import AmbiguousModelError, ExportError, MissingEmbeddingsError
from embedcache.report.export import (
    EXPORT_COLUMNS,
    export_frame,
    read_metadata,
    resolve_key,
    write_export,
)
from embedcache.store import EmbeddingStore
from tests.evaluations import DictStore, draw_tiny, fill_store, toy_key


@pytest.fixture(scope="module")
def demo_subset():
    return draw_version(load_version("demo-v1"))


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory):
    """demo-v1 embedded with kmer-2 through the CLI, as a user would."""
    store = tmp_path_factory.mktemp("export") / "store"
    args = ["embeddings", "--model", "kmer-2", "--version", "demo-v1"]
    code = main([*args, "--store", str(store), "--no-progress"])
    assert code == 0
    return store


@pytest.mark.parametrize("suffix", [".parquet", ".npz"])
def test_export_demo_kmer2_through_the_cli(
    demo_store, demo_subset, tmp_path, suffix, capsys
):
    out = tmp_path / f"demo-kmer2{suffix}"
    code = main(
        [
            "export",
            "--model",
            "kmer-2",
            "--version",
            "demo-v1",
            "--output",
            str(out),
            "--store",
            str(demo_store),
        ]
    )
    assert code == 0
    assert "wrote 2400 items x 16 float32" in capsys.readouterr().out
    items = demo_subset.items
    if suffix == ".parquet":
        frame = pl.read_parquet(out)
        assert frame.columns == list(EXPORT_COLUMNS)
        assert frame.schema["vector"] == pl.Array(pl.Float32, 16)
        vectors = frame["vector"].to_numpy()
        columns = {c: frame[c].to_list() for c in EXPORT_COLUMNS[:-1]}
    else:
        with np.load(out, allow_pickle=False) as data:
            vectors = data["vector"]
            columns = {c: data[c].tolist() for c in EXPORT_COLUMNS[:-1]}
    assert vectors.shape == (2400, 16)
    assert vectors.dtype == np.float32
    for column in ("item_id", "dataset", "split", "label", "seq_sha256"):
        assert columns[column] == items[column].to_list()
    assert sorted(set(columns["split"])) == ["test", "train"]
    # the vectors are the store's, bit for bit, row by row
    store = EmbeddingStore(demo_store, create=False)
    key = resolve_key(store, "kmer-2")
    want, found = store.get(key, items["seq_sha256"].to_list())
    assert found.all()
    np.testing.assert_array_equal(vectors, want)
    meta = read_metadata(out)
    assert meta["version"] == "demo-v1"
    assert meta["subset_id"] == demo_subset.subset_id
    assert meta["model_key"] == key.digest
    assert not meta["comparable"]


def test_missing_vectors_name_the_make_embeddings_command(demo_store, tmp_path, capsys):
    args = ["export", "--model", "kmer-3", "--version", "demo-v1"]
    code = main(
        [*args, "--output", str(tmp_path / "x.npz"), "--store", str(demo_store)]
    )
    assert code == 2
    assert "make embeddings MODEL=kmer-3 VERSION=demo-v1" in capsys.readouterr().err
    assert not (tmp_path / "x.npz").exists()


@pytest.fixture(scope="module")
def tiny_subset(tmp_path_factory):
    return draw_tiny(tmp_path_factory.mktemp("v"))


def test_partly_missing_vectors_are_an_error_with_the_fix(tiny_subset, tmp_path):
    store = DictStore()
    fill_store(store, tiny_subset.items, models=[("toy/a", "hf-encoder", 8, 1.0)])
    key = toy_key("toy/a", "hf-encoder")
    for h in tiny_subset.items["seq_sha256"][:5]:
        del store.data[key][h]
    with pytest.raises(MissingEmbeddingsError) as err:
        export_frame(tiny_subset, store, "toy/a")
    assert str(err.value).startswith("5 of ")
    assert "make embeddings MODEL=toy/a VERSION=tiny-v1" in str(err.value)
    with pytest.raises(MissingEmbeddingsError, match="MODEL=nope VERSION=tiny-v1"):
        export_frame(tiny_subset, store, "nope")


def test_several_matching_keys_are_listed_and_a_digest_picks_one(tiny_subset, tmp_path):
    store = DictStore()
    fill_store(store, tiny_subset.items, models=[("toy/a", "hf-encoder", 8, 1.0)])
    plain = toy_key("toy/a", "hf-encoder")
    averaged = dataclasses.replace(plain, rc_mode="average")
    store.put(
        averaged,
        tiny_subset.items["seq_sha256"].to_list(),
        np.ones((tiny_subset.items.height, 8), np.float32),
    )
    with pytest.raises(AmbiguousModelError) as err:
        export_frame(tiny_subset, store, "toy/a")
    text = str(err.value)
    assert "matches 2 keys" in text
    assert plain.digest[:12] in text
    assert averaged.digest[:12] in text
    assert "--model" in text
    picked = export_frame(tiny_subset, store, averaged.digest[:10])
    assert picked.key == averaged
    assert (picked.frame["vector"].to_numpy() == 1).all()
    assert picked.frame.height == tiny_subset.items.height


def test_wrong_suffix_is_refused_before_any_work(tiny_subset, tmp_path, capsys):
    store = DictStore()
    fill_store(store, tiny_subset.items, models=[("toy/a", "hf-encoder", 8, 1.0)])
    export = export_frame(tiny_subset, store, "toy/a")
    with pytest.raises(ExportError, match=r"\.parquet or \.npz"):
        write_export(export, tmp_path / "out.csv")
    assert not list(tmp_path.iterdir())
    code = main(
        [
            "export",
            "--model",
            "toy/a",
            "--version",
            "demo-v1",
            "--output",
            str(tmp_path / "out.tsv"),
            "--store",
            str(tmp_path / "no-store"),
        ]
    )
    assert code == 2
    assert ".parquet or .npz" in capsys.readouterr().err
