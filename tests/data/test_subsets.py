from __future__ import annotations

import hashlib

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from embedcache.data.datasets import load_split
from embedcache.data.subsets import (
    compute_subset_id,
    draw_stratified,
    draw_version,
    largest_remainder_quotas,
    write_manifest,
)
from embedcache.data.versions import load_version
from embedcache.errors import SubsetDrawError
from tests.mirrors import (
    SHARED_DATA,
    mirror_shared_test_file,
    random_sequences,
    write_split,
)

DATASET = "human_enhancers_cohn"


def _rank(seed: int, item_id: str) -> str:
    return hashlib.sha256(f"{seed}:{item_id}".encode()).hexdigest()


def test_quotas_by_hand():
    # 7 of label 0, 4 of label 1, draw 5: floors 35/11 -> 3, 20/11 -> 1; remainders 2 and 9,
    # so the one left over goes to label 1.
    assert largest_remainder_quotas({0: 7, 1: 4}, 5) == {0: 3, 1: 2}
    # equal remainders: the smaller label wins the leftover
    assert largest_remainder_quotas({0: 3, 1: 3}, 3) == {0: 2, 1: 1}
    assert largest_remainder_quotas({0: 10, 1: 10}, 20) == {0: 10, 1: 10}


def test_quotas_refuse_more_than_pool():
    with pytest.raises(SubsetDrawError, match="cannot draw 12 items from a pool of 11"):
        largest_remainder_quotas({0: 7, 1: 4}, 12)


@given(
    st.dictionaries(st.integers(0, 3), st.integers(1, 500), min_size=1, max_size=4),
    st.data(),
)
def test_quotas_sum_and_stay_within_one_of_share(counts, data):
    total = sum(counts.values())
    n = data.draw(st.integers(0, total))
    quotas = largest_remainder_quotas(counts, n)
    assert sum(quotas.values()) == n
    for label, count in counts.items():
        exact = n * count / total
        assert exact - 1 < quotas[label] < exact + 1
        assert quotas[label] <= count


def test_draw_stratified_matches_hand_computed_ranks():
    ids = [f"ds:test:{row:06d}" for row in range(11)]
    labels = [0, 0, 1, 0, 1, 0, 0, 1, 0, 1, 0]  # seven 0s, four 1s
    pool = pl.DataFrame({"item_id": ids, "label": labels})
    drawn = draw_stratified(pool, 5, seed=42)

    expected = []
    for label, quota in ((0, 3), (1, 2)):
        of_label = [i for i, lab in zip(ids, labels, strict=True) if lab == label]
        expected += sorted(of_label, key=lambda item: _rank(42, item))[:quota]
    assert drawn["item_id"].to_list() == sorted(expected)


def test_subset_id_by_hand():
    ids = ["b:test:000001", "a:train:000002"]
    expected = hashlib.sha256(b"a:train:000002\nb:test:000001").hexdigest()[:16]
    assert compute_subset_id(ids) == expected


def _version_file(tmp_path, *, n_test, n_train, seed=7, extra=""):
    path = tmp_path / "mine.toml"
    path.write_text(
        f'name = "mine"\nseed = {seed}\n[[datasets]]\nname = "{DATASET}"\n'
        f"n_test = {n_test}\nn_train = {n_train}\n{extra}"
    )
    return path


def test_train_is_disjoint_by_sequence_from_the_whole_test_file(tmp_path):
    test_seqs = random_sequences(9, 12, seed=1)
    train_seqs = random_sequences(30, 12, seed=2)
    # plant duplicates: train rows 0-4 repeat test sequences (some in lower case), including
    # test rows that the 3-item test draw will not pick
    for row in range(5):
        train_seqs[row] = test_seqs[row].lower() if row % 2 else test_seqs[row]
    write_split(tmp_path, DATASET, "test", test_seqs, [0, 1, 0, 1, 0, 1, 0, 1, 1])
    write_split(tmp_path, DATASET, "train", train_seqs, [row % 2 for row in range(30)])

    version = load_version(_version_file(tmp_path, n_test=3, n_train=25))
    subset = draw_version(version, data_dir=tmp_path)
    train = subset.items.filter(pl.col("split") == "train")
    test = subset.items.filter(pl.col("split") == "test")
    assert train.height == 25  # exactly the 25 clean candidates
    assert set(train["item_id"]) == {
        f"{DATASET}:train:{row:06d}" for row in range(5, 30)
    }
    assert not set(train["seq"]) & {s.upper() for s in test_seqs}
    assert test.height == 3
    # 9 test rows: four 0s, five 1s -> quotas 3*4/9 = 1 r3, 3*5/9 = 1 r6 -> {0: 1, 1: 2}
    assert test["label"].to_list().count(1) == 2


def test_draw_is_reproducible_and_seed_dependent(tmp_path):
    write_split(
        tmp_path,
        DATASET,
        "test",
        random_sequences(40, 10, seed=3),
        [i % 2 for i in range(40)],
    )
    write_split(
        tmp_path,
        DATASET,
        "train",
        random_sequences(60, 10, seed=4),
        [i % 3 == 0 for i in range(60)],
    )
    first = draw_version(
        load_version(_version_file(tmp_path, n_test=10, n_train=20)), data_dir=tmp_path
    )
    again = draw_version(
        load_version(_version_file(tmp_path, n_test=10, n_train=20)), data_dir=tmp_path
    )
    other = draw_version(
        load_version(_version_file(tmp_path, n_test=10, n_train=20, seed=8)),
        data_dir=tmp_path,
    )
    assert first.items.equals(again.items)
    assert first.subset_id == again.subset_id
    assert first.subset_id != other.subset_id
    assert first.subset_id == compute_subset_id(first.items["item_id"])


def test_self_split_scores_the_rest_and_never_shares_a_sequence(tmp_path):
    seqs = random_sequences(30, 10, seed=5)
    seqs[20] = seqs[3]  # a duplicate inside the one file
    write_split(tmp_path, DATASET, "test", seqs, [i % 2 for i in range(30)])
    path = tmp_path / "self.toml"
    path.write_text(
        f'name = "self"\nseed = 1\n[[datasets]]\nname = "{DATASET}"\n'
        'test_split = "test"\ntrain_split = "test"\nn_test = "rest"\nn_train = 10\n'
    )
    subset = draw_version(load_version(path), data_dir=tmp_path)
    train = subset.items.filter(pl.col("split") == "train")
    test = subset.items.filter(pl.col("split") == "test")
    assert train.height == 10
    assert not set(train["seq"]) & set(test["seq"])
    assert set(train["item_id"]) | set(test["item_id"]) <= {
        f"{DATASET}:test:{i:06d}" for i in range(30)
    }
    # test is every row train did not take, minus rows whose sequence train holds
    train_rows = {int(item.rsplit(":", 1)[1]) for item in train["item_id"]}
    expected_test = {
        f"{DATASET}:test:{row:06d}"
        for row, seq in enumerate(seqs)
        if row not in train_rows and seq not in set(train["seq"])
    }
    assert set(test["item_id"]) == expected_test


def test_draw_asking_too_much_names_the_pool(tmp_path):
    write_split(
        tmp_path, DATASET, "test", random_sequences(5, 10, seed=6), [0, 1, 0, 1, 0]
    )
    write_split(
        tmp_path, DATASET, "train", random_sequences(5, 10, seed=7), [0, 1, 0, 1, 0]
    )
    with pytest.raises(SubsetDrawError) as info:
        draw_version(
            load_version(_version_file(tmp_path, n_test=3, n_train=50)),
            data_dir=tmp_path,
        )
    assert f"{DATASET}:train" in str(info.value.__notes__)


def test_manifest_columns_and_sidecar(tmp_path):
    subset = draw_version(load_version("demo-v1"))
    out = tmp_path / "m.tsv"
    write_manifest(subset, out)
    manifest = pl.read_csv(out, separator="\t")
    assert manifest.columns == [
        "item_id",
        "dataset",
        "split",
        "label",
        "seq",
        "seq_sha256",
    ]
    assert manifest.height == subset.items.height == 2400
    row = manifest.row(0, named=True)
    assert row["seq_sha256"] == hashlib.sha256(row["seq"].encode()).hexdigest()
    assert '"subset_id": "' + subset.subset_id in (tmp_path / "m.tsv.json").read_text()
    assert not list(tmp_path.glob(".*tmp"))


def test_demo_version_draws_500_train_per_dataset():
    subset = draw_version(load_version("demo-v1"))
    counts = {
        (d, s): n
        for d, s, n in subset.items.group_by("dataset", "split").len().iter_rows()
    }
    assert counts[(DATASET, "train")] == 500
    assert counts[("human_nontata_promoters", "train")] == 500
    assert counts[(DATASET, "test")] + counts[(DATASET, "train")] <= 1200
    assert not subset.version.comparable


needs_shared = pytest.mark.skipif(
    not (SHARED_DATA / "genomic-benchmarks").exists(), reason="../shared/data is absent"
)


@needs_shared
def test_bundled_demo_data_is_rebuildable_from_shared_data():
    from scripts.build_demo_data import DEMO_DATA_DIR, build

    for dataset in ("human_enhancers_cohn", "human_nontata_promoters"):
        bundled = DEMO_DATA_DIR / dataset / "data" / "demo-00000-of-00001.parquet"
        assert build(SHARED_DATA, dataset) == bundled.read_bytes()


@needs_shared
def test_real_test_file_draw_of_n100(tmp_path):
    """n100-style draw over the real nontata test file, checked against a hand computation."""
    mirror_shared_test_file(tmp_path, "human_nontata_promoters")
    pool = load_split("human_nontata_promoters", "test", data_dir=tmp_path).frame
    drawn = draw_stratified(pool, 100, seed=20261006)
    # 4,119 zeros and 4,915 ones: 100 * 4119 / 9034 = 45.59, 54.41 -> 45 + 54, leftover to label 0
    assert drawn["label"].to_list().count(0) == 46
    zeros = pool.filter(pl.col("label") == 0)["item_id"].to_list()
    expected_zeros = sorted(sorted(zeros, key=lambda i: _rank(20261006, i))[:46])
    assert drawn.filter(pl.col("label") == 0)["item_id"].to_list() == expected_zeros
