"""The board as the hub shows it: Source, Overlap, per-row details; overlap declarations;
the catalogue's pretraining corpora; and the reports home page (also in headless Chromium)."""

from __future__ import annotations

import dataclasses
import os
import re

import polars as pl
import pytest

from embedcache.analysis.selection import ModelEntry
from embedcache.models.catalogue import load_catalogue
from embedcache.report.home import rendered_versions, write_home
from embedcache.report.overlap import (
    NONE,
    NOT_DECLARED,
    OverlapFileError,
    entry_overlap,
    name_overlap,
    read_declarations,
)
from embedcache.report.published import load_published
from embedcache.report.tables import BY_DATASET, leaderboard_table, published_table
from scripts.screenshot_report import chromium, find_chromium
from tests.evaluations import model_key, tiny_board

CADUCEUS_PH = "kuleshov-group/caduceus-ph_seqlen-131k_d_model-256_n_layer-16"


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    return tiny_board(tmp_path_factory.mktemp("board"), n_boot=100)[2]


def test_every_known_checkpoint_states_its_corpus_and_where(tmp_path):
    entries = load_catalogue()
    assert len(entries) >= 17
    for e in entries:
        assert e.pretraining_data.strip(), e.hub_id
        # a source: a URL, an arXiv id or a DOI
        assert re.search(r"https?://|arXiv:\d|doi:10\.", e.pretraining_source), e.hub_id
    by_id = {e.hub_id: e for e in entries}
    assert by_id[CADUCEUS_PH].human_genome == "hg38"
    assert by_id["LongSafari/hyenadna-tiny-1k-seqlen-hf"].human_genome == "hg38"
    assert "T2T" in by_id["AIRI-Institute/gena-lm-bert-base-t2t"].human_genome


def test_board_has_source_overlap_and_a_details_row_per_model(board):
    table = leaderboard_table(board)
    cols = table.frame.columns
    assert cols[:6] == ["rank", "model", "Value", "95% CI", "n", "≠"]
    assert {"Source", "Overlap", BY_DATASET} <= set(cols)
    assert set(table.frame["Source"]) == {"reproduced"}
    # toy models are in no catalogue: nobody declared an overlap
    assert set(table.frame["Overlap"]) == {NOT_DECLARED}
    assert "what a declared overlap" in table.note or "Overlap:" in table.note
    html = table.to_html()
    k = len(board.datasets)
    assert html.count("<details") == table.frame.height
    assert (
        html.count(f"<summary>{BY_DATASET}: {k} levels</summary>") == table.frame.height
    )
    # the details hold each dataset's value, CI and n, matching results.csv
    first = table.frame["model"][0]
    cell = table.frame[BY_DATASET][0]
    for d in board.datasets:
        row = board.results.filter(
            (pl.col("model") == first)
            & (pl.col("dataset") == d)
            & (pl.col("metric") == "accuracy")
        ).row(0, named=True)
        assert f"<td>{d}</td><td>{row['value']:.3f}</td>" in cell
        assert (
            f"[{row['ci_low']:.3f}, {row['ci_high']:.3f}]</td><td>{row['n']}</td>"
            in cell
        )
    assert "<script" not in html


def test_overlap_comes_from_catalogue_declaration_or_says_none(tmp_path):
    known = ModelEntry(
        "ph", dataclasses.replace(model_key(CADUCEUS_PH)), is_floor=False
    )
    assert entry_overlap(known) == "hg38"
    control = ModelEntry(
        "ph (random init)",
        dataclasses.replace(model_key(CADUCEUS_PH), revision="random-init:0"),
        is_floor=True,
    )
    assert entry_overlap(control) == NONE
    assert entry_overlap(ModelEntry("majority", None, is_floor=True)) == NONE
    kmer = ModelEntry("kmer-4", model_key("kmer-4", "kmer"), is_floor=True)
    assert entry_overlap(kmer) == NONE
    mine = ModelEntry("mine", model_key("/models/mine"), is_floor=False)
    assert entry_overlap(mine) == NOT_DECLARED
    path = tmp_path / "overlap.toml"
    path.write_text(
        '["/models/mine"]\npretraining_data = "hg38 + mouse"\n'
        'human_genome = "hg38"\nsource = "our preprint"\n'
        f'["{CADUCEUS_PH}"]\npretraining_data = "nothing human"\nhuman_genome = ""\n'
    )
    declared = read_declarations(path)
    assert entry_overlap(mine, declared) == "hg38"
    assert entry_overlap(known, declared) == NONE  # a declaration wins
    assert name_overlap(CADUCEUS_PH) == "hg38"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('["m"]\nhuman_genome = "hg38"\n', "missing ['pretraining_data']"),
        ('["m"]\npretraining_data = "x"\nhuman_genome = ""\ncolour = 1\n', "unknown"),
        ('m = "hg38"\n', "must be a table"),
        ("not toml [", "overlap file"),
    ],
)
def test_a_bad_overlap_file_is_named(tmp_path, text, problem):
    path = tmp_path / "o.toml"
    path.write_text(text)
    with pytest.raises(OverlapFileError, match=re.escape(problem)):
        read_declarations(path)


def test_published_rows_say_published_with_their_overlap():
    source = next(s for s in load_published() if s.version == "atlas-n100-v1")
    datasets = ("human_enhancers_cohn",)
    frame = published_table(source, datasets).frame
    assert set(frame["Source"]) == {"published"}
    caduceus = frame.filter(pl.col("model (as published)") == CADUCEUS_PH)
    assert caduceus["Overlap"].to_list() == ["hg38"]


def _fake_report(root, name, rows, *, mtime):
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "index.html").write_text("<html></html>")
    pl.DataFrame(rows).write_csv(folder / "results.csv")
    os.utime(folder / "index.html", (mtime, mtime))


def _row(model, value, *, floor):
    return {
        "version": "v",
        "subset_id": "abcdef0123456789",
        "model": model,
        "model_key": "k" * 8,
        "dataset": "mean",
        "metric": "accuracy",
        "value": value,
        "ci_low": value - 0.02,
        "ci_high": value + 0.02,
        "n": 300,
        "is_floor": floor,
    }


@pytest.fixture
def home(tmp_path):
    _fake_report(
        tmp_path,
        "atlas-n100-v1",
        [
            _row("org/a", 0.81, floor=False),
            _row("org/b", 0.85, floor=False),
            _row("kmer-4", 0.7, floor=True),
        ],
        mtime=1_780_000_000,
    )
    _fake_report(
        tmp_path, "demo-v1", [_row("kmer-4", 0.75, floor=True)], mtime=1_780_000_100
    )
    (tmp_path / "empty").mkdir()  # no report in it: not listed
    return write_home(tmp_path)


def test_home_lists_every_rendered_version_with_its_top_model(home):
    versions = {v.name: v for v in rendered_versions(home.parent)}
    assert sorted(versions) == ["atlas-n100-v1", "demo-v1"]
    atlas = versions["atlas-n100-v1"]
    assert (atlas.n_models, atlas.n_floors) == (2, 1)
    assert atlas.top == "org/b 0.850 [0.830, 0.870]"
    assert atlas.subset_id == "abcdef0123456789"
    assert versions["demo-v1"].top.startswith("kmer-4 (floor) 0.750")
    text = home.read_text()
    assert 'href="atlas-n100-v1/index.html"' in text
    assert 'href="demo-v1/index.html"' in text
    assert "not comparable to the leaderboard" in text  # demo-v1 marked
    assert "2026-" in text  # the render date


CHROMIUM = find_chromium()


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed")
def test_home_page_loads_in_headless_chromium(home):
    dom = chromium(CHROMIUM, home, "--dump-dom", "--virtual-time-budget=2000")
    assert "<title>Genomic Benchmarks probe leaderboards</title>" in dom
    rows = re.findall(r'<a href="([^"]+)/index.html">', dom)
    assert rows == ["atlas-n100-v1", "demo-v1"]
    assert "org/b 0.850 [0.830, 0.870]" in dom
