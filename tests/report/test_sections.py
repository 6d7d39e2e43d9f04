"""The report's layout: section order, contents, collapsed details, published rows."""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from embedcache.analysis.evaluation import evaluate
from embedcache.analysis.leakage import audit_items
from embedcache.data.subsets import draw_version
from embedcache.data.versions import list_versions, load_version
from embedcache.errors import VersionSpecError
from embedcache.report import sections
from embedcache.report.parts import Html
from embedcache.report.provenance import model_keys_table, store_keys_table
from embedcache.report.published import (
    STATUS,
    load_published,
    published_for,
)
from embedcache.report.tables import leaderboard_table
from tests.evaluations import DictStore, fill_store, tiny_board

CADUCEUS_PH = "kuleshov-group/caduceus-ph_seqlen-131k_d_model-256_n_layer-16"
DATASETS = (
    "human_enhancers_cohn",
    "human_nontata_promoters",
    "demo_coding_vs_intergenomic_seqs",
)
# page order a reader of a paper wants: the board first, provenance last
ORDER = [
    "leaderboard",
    "per-dataset",
    "macro-f1",
    "floors",
    "figures",
    "agreement",
    "leakage",
    "caveats",
    "probes",
    "run",
    "provenance",
]
CREATED = datetime(2026, 12, 3, 9, 30, tzinfo=UTC)


@pytest.fixture(scope="module")
def tiny_context(tmp_path_factory):
    subset, store, evaluation = tiny_board(
        tmp_path_factory.mktemp("versions"), n_boot=200, seed=1
    )
    return sections.ReportContext(
        evaluation=evaluation,
        subset=subset,
        leakage=audit_items(subset.items),
        parameters={"version": str(subset.version.path), "n_boot": 200},
        store_keys=store.keys(),
        created=CREATED,
    )


@pytest.fixture(scope="module")
def tiny_page(tiny_context):
    return sections.page(tiny_context).text


def _ids(page: str) -> list[str]:
    return re.findall(r'<section class="ec-section" id="([^"]+)"', page)


def test_sections_come_in_the_papers_order(tiny_context, tiny_page):
    built = sections.build_sections(tiny_context)
    assert [s.anchor for s in built] == ORDER  # no published rows for tiny-v1
    page = tiny_page
    assert _ids(page) == ORDER
    # title, summary line, then the board's table before anything else
    title = page.index("<h1>")
    summary = page.index('class="ec-summary"')
    board = page.index("Leaderboard (accuracy)")
    assert title < summary < board < page.index('id="per-dataset"')
    assert page.index("<table") > summary  # no table above the board


def test_contents_link_every_section_shown(tiny_page):
    page = tiny_page
    nav = re.search(r'<nav class="ec-toc">(.*?)</nav>', page).group(1)
    assert re.findall(r'href="#([^"]+)"', nav) == _ids(page)


def test_details_are_collapsed_and_the_board_is_not(tiny_context):
    built = {s.anchor: s for s in sections.build_sections(tiny_context)}
    collapsed = {a for a, s in built.items() if s.collapsed}
    assert collapsed == {
        "per-dataset",
        "macro-f1",
        "agreement",
        "probes",
        "run",
        "provenance",
    }
    assert "<details>" not in built["leaderboard"].to_html()
    per_dataset = built["per-dataset"].to_html()
    assert per_dataset.index("<details><summary><h2>") < per_dataset.index("<table")
    assert "Macro F1 per dataset" in built["macro-f1"].to_html()


def test_summary_line_names_version_n_subset_and_date(tiny_context, tiny_page):
    line = sections.summary_line(tiny_context)
    ev = tiny_context.evaluation
    assert line.startswith("tiny-v1 · n = 210 test items over 2 datasets")
    assert ev.subset_id in line
    assert "2026-12-03 09:30 UTC" in line
    # the same timestamp in the provenance
    assert tiny_page.count("2026-12-03 09:30 UTC") == 2


def test_model_keys_are_a_readable_table_not_json(tiny_context, tiny_page):
    page = tiny_page
    assert '{"adapter"' not in page
    assert "&quot;adapter&quot;" not in page
    keys = model_keys_table(tiny_context.evaluation).frame
    assert keys["model"].to_list() == ["toy/strong", "toy/weak", "kmer-2", "kmer-3"]
    assert {"revision", "adapter", "rc_mode", "dtype", "key digest"} <= set(
        keys.columns
    )
    strong = keys.row(0, named=True)
    assert strong["key digest"] == tiny_context.evaluation.ranked[0].key.digest
    assert strong["options"] == "-"
    store = store_keys_table(tiny_context.store_keys).frame
    assert store.height == 4
    assert store["vectors"].to_list() == [None] * 4  # bare keys carry no counts


def test_not_comparable_warning_sits_under_the_title(tiny_context):
    head = sections.header(tiny_context, []).text
    assert "tiny-v1 is not comparable to the leaderboard" in head
    comparable = dataclasses.replace(
        tiny_context,
        evaluation=dataclasses.replace(tiny_context.evaluation, comparable=True),
    )
    assert "not comparable" not in sections.header(comparable, []).text


def test_a_new_section_is_one_function(tiny_context):
    def extra(context):
        return sections.Section("extra", "Extra analysis", (Html("<p>x</p>"),))

    order = [*sections.SECTIONS[:1], extra, *sections.SECTIONS[1:]]
    page = sections.page(tiny_context, order).text
    assert _ids(page)[:2] == ["leaderboard", "extra"]
    assert 'href="#extra">Extra analysis<' in page
    with pytest.raises(ValueError, match="share an anchor"):
        sections.build_sections(tiny_context, [extra, extra])


# --- published rows -------------------------------------------------------------------


def test_published_file_lists_the_issues_numbers():
    sources = {s.id: s for s in load_published()}
    hub = sources["hub-atlas-n100-v1"]
    assert hub.version == "atlas-n100-v1"
    ph = next(r for r in hub.rows if r.model == CADUCEUS_PH)
    assert (ph.mean, ph.ci_low, ph.ci_high, ph.macro_f1) == (0.853, 0.81, 0.887, 0.853)
    assert ph.datasets == dict(zip(DATASETS, (0.79, 0.83, 0.94), strict=True))
    geneb = sources["geneb"]
    assert geneb.version == "atlas-full-v1"
    assert "2606.04525" in geneb.citation
    assert [(r.model, r.mean) for r in geneb.rows] == [
        ("GENERator-eukaryote-3b", 0.861),
        ("NT-2.5b-multi-species", 0.842),
        ("DNABERT-2", 0.839),
        ("GROVER", 0.830),
        ("NT-v2-250m", 0.822),
        ("HyenaDNA-medium-160k", 0.810),
        ("Caduceus-ps-131k", 0.800),
    ]
    assert any("C = 1" in d and "StandardScaler" in d for d in geneb.differences)


def test_published_sources_belong_to_one_shipped_version_each(tmp_path):
    shown = {v.name: [s.id for s in published_for(v)] for v in list_versions()}
    assert shown == {
        "atlas-full-v1": ["geneb"],
        "atlas-n100-v1": ["hub-atlas-n100-v1"],
        "demo-v1": [],
    }
    # a user's file that reuses the name but draws other items gets none
    text = load_version("atlas-n100-v1").path.read_text()
    other = tmp_path / "mine" / "atlas-n100-v1.toml"
    other.parent.mkdir()
    other.write_text(text.replace("n_test = 100", "n_test = 50", 1))
    assert published_for(load_version(other)) == ()
    # the same draw from another path is the same board
    same = tmp_path / "atlas-n100-v1.toml"
    same.write_text(text)
    assert [s.id for s in published_for(load_version(same))] == ["hub-atlas-n100-v1"]


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ('model = "m"\nmean = 1.3', "mean = 1.3 is not in"),
        ('model = "m"\nmean = 0.8\nci_low = 0.81\nci_high = 0.9', "contain the mean"),
        ('model = "m"\nmean = 0.8\nci_low = 0.7', "give both ends"),
        ('model = "m"\nmean = 0.8\ndatasets = { nope = 0.5 }', "unknown dataset"),
        ("mean = 0.8", "lacks 'model'"),
    ],
)
def test_a_bad_published_row_is_named(tmp_path, row, problem):
    path = tmp_path / "p.toml"
    path.write_text(
        '[[sources]]\nid = "s"\nversion = "atlas-n100-v1"\ntitle = "t"\n'
        'citation = "c"\nmetric = "m"\ndifferences = ["d"]\n'
        f"[[sources.rows]]\n{row}\n"
    )
    with pytest.raises(VersionSpecError, match=problem) as err:
        load_published(path)
    assert "source 's'" in str(err.value)


def test_a_source_must_name_its_differences(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(
        '[[sources]]\nid = "s"\nversion = "v"\ntitle = "t"\ncitation = "c"\n'
        'metric = "m"\ndifferences = []\nrows = []\n'
    )
    with pytest.raises(VersionSpecError, match="names no protocol difference"):
        load_published(path)


@pytest.fixture(scope="module")
def fake_mirror(tmp_path_factory):
    """Random sequences in the hub's layout: enough to draw both atlas versions."""
    root = tmp_path_factory.mktemp("mirror")
    rng = np.random.default_rng(5)
    for name in DATASETS:
        for split, n in (("train", 620), ("test", 130)):
            labels = rng.integers(0, 2, n)
            # label 1 is GC-rich: a k-mer probe has something to find
            seqs = [
                "".join(
                    rng.choice(
                        list("ACGT"),
                        60,
                        p=[0.2, 0.3, 0.3, 0.2] if y else [0.3] * 2 + [0.2] * 2,
                    )
                )
                for y in labels
            ]
            folder = root / name / "data"
            folder.mkdir(parents=True, exist_ok=True)
            pl.DataFrame({"seq": seqs, "label": labels}).write_parquet(
                folder / f"{split}-00000-of-00001.parquet"
            )
    return root


def _atlas_context(version: str, mirror: Path) -> sections.ReportContext:
    subset = draw_version(load_version(version), data_dir=mirror)
    store = DictStore()
    fill_store(
        store,
        subset.items,
        models=[(CADUCEUS_PH, "caduceus", 8, 1.0), ("kmer-2", "kmer", 16, 0.4)],
    )
    evaluation = evaluate(subset, store, n_boot=100, seed=0)
    return sections.ReportContext(
        evaluation=evaluation, subset=subset, store_keys=store.keys()
    )


def test_hub_rows_appear_beside_atlas_n100_v1_only(fake_mirror):
    context = _atlas_context("atlas-n100-v1", fake_mirror)
    assert context.evaluation.bootstrap.n("mean") == 300
    page = sections.page(context).text
    ids = _ids(page)
    assert ids[:2] == ["leaderboard", "published"]  # right below the board
    published = page[page.index('id="published"') : page.index('id="per-dataset"')]
    assert f"Hub board, atlas-n100-v1: {STATUS}" in published
    assert "0.853" in published
    assert "[0.810, 0.887]" in published
    assert "0.940" in published  # per dataset
    assert "e2e9a5a57b976913" in published  # the difference is named
    assert "GENERator" not in page
    # never ranked: the board and results.csv hold only what was recomputed here
    ranked = leaderboard_table(context.evaluation).frame["model"].to_list()
    assert ranked == [CADUCEUS_PH]
    assert set(context.evaluation.results["model"]) == {
        CADUCEUS_PH,
        "kmer-2",
        "majority",
    }
    assert page.count(STATUS) == 2 + 1  # two rows and the caption


def test_geneb_rows_appear_beside_atlas_full_v1_only(fake_mirror):
    context = _atlas_context("atlas-full-v1", fake_mirror)
    page = sections.page(context).text
    published = page[page.index('id="published"') : page.index('id="per-dataset"')]
    assert f"GENEB: {STATUS}" in published
    for model, value in (
        ("GENERator-eukaryote-3b", "0.861"),
        ("Caduceus-ps-131k", "0.800"),
    ):
        assert f"<td {_td()}>{model}</td>" in published
        assert value in published
    assert "not published" in published  # no CI was published
    assert "C = 1" in published
    assert "0.853" not in page  # the hub's atlas-n100-v1 rows stay with their version
    assert "Hub board" not in page


def _td() -> str:
    return 'style="border:1px solid #ccc;padding:3px 8px;text-align:left"'


def test_no_published_rows_beside_demo_or_a_users_version(tiny_page):
    page = tiny_page
    assert "published" not in _ids(page)
    assert STATUS not in page
