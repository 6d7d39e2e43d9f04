from __future__ import annotations

import pytest

from embedcache.cli import main
from embedcache.data.versions import list_versions, load_version
from embedcache.errors import VersionSpecError


def test_shipped_versions_follow_the_protocol():
    versions = {v.name: v for v in list_versions()}
    assert set(versions) == {"atlas-full-v1", "atlas-n100-v1", "demo-v1"}
    full, n100 = versions["atlas-full-v1"], versions["atlas-n100-v1"]
    for version in (full, n100):
        assert version.seed == 20261006
        assert version.comparable
        assert version.dataset_names == (
            "human_enhancers_cohn",
            "human_nontata_promoters",
            "demo_coding_vs_intergenomic_seqs",
        )
        assert all(draw.n_train == 500 for draw in version.datasets)
    assert all(draw.n_test is None for draw in full.datasets)
    assert all(draw.n_test == 100 for draw in n100.datasets)
    assert not versions["demo-v1"].comparable
    assert all(draw.self_split for draw in versions["demo-v1"].datasets)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            'seed = 1\n[[datasets]]\nname = "human_enhancers_cohn"\nn_test = 5\nn_train = 5\n',
            "lacks the field 'name'",
        ),
        ('name = "x"\nseed = "one"\ndatasets = []\n', "seed must be an integer"),
        (
            'name = "x"\nseed = 1\n[[datasets]]\nname = "nope"\nn_test = 5\nn_train = 5\n',
            "unknown dataset 'nope'",
        ),
        (
            'name = "x"\nseed = 1\n[[datasets]]\nname = "human_enhancers_cohn"\nn_test = "rest"\nn_train = 5\n',
            "n_test must be a positive integer or 'all'",
        ),
        (
            'name = "x"\nseed = 1\n[[datasets]]\nname = "human_enhancers_cohn"\nn_test = 5\nn_train = 1\n',
            "n_train must be an integer >= 2",
        ),
        (
            'name = "x"\nseed = 1\n[[datasets]]\nname = "human_enhancers_cohn"\nn_test = 5\nn_train = 5\nsource = "ftp"\n',
            "source 'ftp'",
        ),
        ('name = "x"\nseed = [1\n', "cannot read version file"),
    ],
)
def test_malformed_version_files_say_what_is_wrong(tmp_path, body, expected):
    path = tmp_path / "bad.toml"
    path.write_text(body)
    with pytest.raises(VersionSpecError, match=expected):
        load_version(path)


def test_unknown_version_lists_the_shipped_ones():
    with pytest.raises(VersionSpecError, match="atlas-full-v1, atlas-n100-v1, demo-v1"):
        load_version("atlas-v9")


def test_versions_command_lists_datasets_and_n(capsys):
    assert main(["versions"]) == 0
    out = capsys.readouterr().out
    assert "atlas-n100-v1" in out
    assert "demo-v1  seed=20261006  (not comparable to the leaderboard)" in out
    assert "test=100" in out
    assert "test=rest" in out
