from __future__ import annotations

import hashlib
import os
from pathlib import Path

import polars as pl
import pytest

from embedcache.cli import main
from embedcache.data.datasets import dataset_spec, load_split
from embedcache.errors import (
    ChecksumMismatchError,
    DataUnavailableError,
    InvalidLabelError,
    InvalidSequenceError,
)
from tests.cli.helpers import run_cli
from tests.mirrors import (
    SHARED_DATA,
    mirror_shared_test_file,
    random_sequences,
    write_split,
)

DATASET = "human_enhancers_cohn"
REPO_ROOT = Path(__file__).resolve().parents[2]


def test_mirror_rows_are_upper_cased_hashed_and_numbered(tmp_path):
    write_split(tmp_path, DATASET, "test", ["acgtn", "GGCC", "AaCc"], [1, 0, 1])
    split = load_split(DATASET, "test", data_dir=tmp_path)
    frame = split.frame
    assert frame["item_id"].to_list() == [f"{DATASET}:test:00000{i}" for i in range(3)]
    assert frame["seq"].to_list() == ["ACGTN", "GGCC", "AACC"]
    assert frame["seq_sha256"][0] == hashlib.sha256(b"ACGTN").hexdigest()
    assert frame["label"].to_list() == [1, 0, 1]
    assert split.source.startswith("mirror")
    ((name, digest),) = split.files
    assert (
        digest
        == hashlib.sha256((tmp_path / DATASET / "data" / name).read_bytes()).hexdigest()
    )


def test_rows_of_several_files_keep_published_order(tmp_path):
    write_split(
        tmp_path,
        DATASET,
        "train",
        ["AAAA", "CCCC"],
        [0, 1],
        name="train-00000-of-00002.parquet",
    )
    write_split(
        tmp_path, DATASET, "train", ["GGGG"], [1], name="train-00001-of-00002.parquet"
    )
    frame = load_split(DATASET, "train", data_dir=tmp_path).frame
    assert frame["seq"].to_list() == ["AAAA", "CCCC", "GGGG"]
    assert frame["item_id"][2] == f"{DATASET}:train:000002"


@pytest.mark.parametrize(
    ("seqs", "labels", "error", "expected"),
    [
        (
            ["ACGT", "ACGXT"],
            [0, 1],
            InvalidSequenceError,
            r"human_enhancers_cohn:test:000001: character 'X' at position 4",
        ),
        (
            ["ACGT", ""],
            [0, 1],
            InvalidSequenceError,
            r"human_enhancers_cohn:test:000001: sequence is empty",
        ),
        (
            ["ACGT", "AC-T", "ACGU"],
            [0, 1, 1],
            InvalidSequenceError,
            r"'-' at position 3 .*\(2 row\(s\) affected",
        ),
        (
            ["ACGT", "ACGT"],
            [0, 2],
            InvalidLabelError,
            r"human_enhancers_cohn:test:000001: label 2 is not 0 or 1",
        ),
    ],
)
def test_bad_rows_name_the_item(tmp_path, seqs, labels, error, expected):
    write_split(tmp_path, DATASET, "test", seqs, labels)
    with pytest.raises(error, match=expected):
        load_split(DATASET, "test", data_dir=tmp_path)


def test_missing_columns_are_named(tmp_path):
    folder = tmp_path / DATASET / "data"
    folder.mkdir(parents=True)
    pl.DataFrame({"sequence": ["ACGT"], "label": [0]}).write_parquet(
        folder / "test-00000-of-00001.parquet"
    )
    with pytest.raises(InvalidSequenceError, match=r"lacks column\(s\) \['seq'\]"):
        load_split(DATASET, "test", data_dir=tmp_path)


def test_pinned_file_with_wrong_bytes_is_rejected(tmp_path):
    dataset = "human_nontata_promoters"
    pinned = "test-00000-of-00001-d7614d9116c62f44.parquet"
    write_split(tmp_path, dataset, "test", ["ACGT"], [1], name=pinned)
    with pytest.raises(ChecksumMismatchError) as info:
        load_split(dataset, "test", data_dir=tmp_path)
    message = str(info.value)
    assert pinned in message
    assert dataset_spec(dataset).sha256[f"data/{pinned}"] in message
    assert (
        hashlib.sha256((tmp_path / dataset / "data" / pinned).read_bytes()).hexdigest()
        in message
    )
    assert "hf download" in message


def test_missing_mirror_says_how_to_make_one(tmp_path):
    with pytest.raises(
        DataUnavailableError,
        match=r"hf download katarinagresova/Genomic_Benchmarks_human_enhancers_cohn --repo-type dataset --revision 49ef8d0d",
    ):
        load_split(DATASET, "test", data_dir=tmp_path)


def _run_cli(args, *, env_extra):
    env = {**os.environ, **env_extra, "PYTHONPATH": str(REPO_ROOT)}
    return run_cli(args, env=env, timeout=120)


def _hub_cache(hf_home: Path, dataset: str, split: str, seqs, labels) -> None:
    """Lay out what `hf download` leaves in HF_HOME for a dataset at its pinned revision."""
    spec = dataset_spec(dataset)
    repo = hf_home / "hub" / f"datasets--{spec.repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / spec.revision
    write_split(snapshot.parent, spec.revision, split, seqs, labels)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(spec.revision)


def test_hub_path_offline_from_a_warm_cache(tmp_path):
    """The real hub code path, offline, reading what the hub client's cache holds."""
    hf_home = tmp_path / "hf"
    test_seqs = random_sequences(12, 16, seed=11)
    train_seqs = random_sequences(20, 16, seed=12)
    _hub_cache(hf_home, DATASET, "test", test_seqs, [i % 2 for i in range(12)])
    _hub_cache(hf_home, DATASET, "train", train_seqs, [i % 2 for i in range(20)])
    version = tmp_path / "v.toml"
    version.write_text(
        f'name = "v"\nseed = 3\n[[datasets]]\nname = "{DATASET}"\nn_test = 4\nn_train = 6\n'
    )
    out = tmp_path / "manifest.tsv"
    env = {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "EMBEDCACHE_DATA_DIR": ""}
    result = _run_cli(
        ["subset", "--version", str(version), "--output", str(out)], env_extra=env
    )
    assert result.returncode == 0, result.stderr
    manifest = pl.read_csv(out, separator="\t")
    assert manifest.height == 10
    assert set(manifest.filter(pl.col("split") == "test")["seq"]) <= set(test_seqs)
    assert result.stdout.strip().splitlines()[-1].startswith("subset_id=")


def test_offline_without_cache_or_mirror_is_a_clear_error(tmp_path):
    out = tmp_path / "manifest.tsv"
    out.write_text("an earlier manifest\n")
    env = {
        "HF_HOME": str(tmp_path / "empty"),
        "HF_HUB_OFFLINE": "1",
        "EMBEDCACHE_DATA_DIR": "",
    }
    result = _run_cli(
        ["subset", "--version", "atlas-n100-v1", "--output", str(out)], env_extra=env
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert (
        "hf download katarinagresova/Genomic_Benchmarks_human_enhancers_cohn"
        in result.stderr
    )
    assert out.read_text() == "an earlier manifest\n"  # nothing half-written


def test_bad_row_via_cli_leaves_earlier_manifest(tmp_path, capsys):
    write_split(tmp_path, DATASET, "test", ["ACGT", "ACGT", "AZGT"], [0, 1, 0])
    write_split(tmp_path, DATASET, "train", ["CCCC", "GGGG"], [0, 1])
    version = tmp_path / "v.toml"
    version.write_text(
        f'name = "v"\nseed = 3\n[[datasets]]\nname = "{DATASET}"\nn_test = "all"\nn_train = 2\n'
    )
    out = tmp_path / "manifest.tsv"
    out.write_text("keep me\n")
    code = main(
        [
            "subset",
            "--version",
            str(version),
            "--data-dir",
            str(tmp_path),
            "--output",
            str(out),
        ]
    )
    assert code == 2
    assert (
        "human_enhancers_cohn:test:000002: character 'Z' at position 2"
        in capsys.readouterr().err
    )
    assert out.read_text() == "keep me\n"


@pytest.mark.skipif(
    not (SHARED_DATA / "genomic-benchmarks").exists(), reason="../shared/data is absent"
)
def test_real_nontata_test_file_validates_with_its_n(tmp_path):
    mirror_shared_test_file(tmp_path, "human_nontata_promoters")
    frame = load_split("human_nontata_promoters", "test", data_dir=tmp_path).frame
    assert frame.height == 9034
    assert frame["seq"].str.contains("N").sum() == 1
    assert frame["label"].sum() == 4915
