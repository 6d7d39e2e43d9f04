from __future__ import annotations

import dataclasses
import re

import numpy as np
import polars as pl
import pytest

from embedcache.analysis.curves import CURVE_COLUMNS
from embedcache.analysis.evaluation import evaluate
from embedcache.analysis.leakage import audit_items
from embedcache.analysis.results import RESULT_COLUMNS, write_results
from embedcache.analysis.selection import match_keys, select_models
from embedcache.data.subsets import draw_version
from embedcache.data.versions import load_version
from embedcache.errors import MissingEmbeddingsError
from embedcache.report.figures import accuracy_figure, paired_difference_figure
from embedcache.report.provenance import model_keys_table, provenance_table
from embedcache.report.tables import (
    caveats,
    dataset_table,
    floors_table,
    leaderboard_table,
    leakage_table,
)
from embedcache.specs import ModelKey
from tests.evaluations import MODELS, TINY_VERSION, DictStore, fill_store, toy_key


@pytest.fixture(scope="module")
def tiny_version(tmp_path_factory):
    path = tmp_path_factory.mktemp("versions") / "tiny-v1.toml"
    path.write_text(TINY_VERSION)
    return path


@pytest.fixture(scope="module")
def tiny_subset(tiny_version):
    return draw_version(load_version(tiny_version))


@pytest.fixture(scope="module")
def evaluation(tiny_subset):
    store = DictStore()
    fill_store(store, tiny_subset.items)
    return evaluate(tiny_subset, store, n_boot=300, seed=1)


def test_results_frame_has_one_row_per_model_dataset_metric(evaluation, tiny_subset):
    res = evaluation.results
    assert res.columns == list(RESULT_COLUMNS)
    names = ["toy/strong", "toy/weak", "majority", "kmer-2", "kmer-3"]
    assert res["model"].unique(maintain_order=True).to_list() == names
    assert res.height == len(names) * 3 * 2
    assert set(res["dataset"]) == {
        "human_enhancers_cohn",
        "human_nontata_promoters",
        "mean",
    }
    assert set(res["metric"]) == {"accuracy", "macro_f1"}
    assert res["version"].unique().to_list() == ["tiny-v1"]
    assert res["subset_id"].unique().to_list() == [tiny_subset.subset_id]
    floors = res.filter(pl.col("is_floor"))["model"].unique().sort().to_list()
    assert floors == ["kmer-2", "kmer-3", "majority"]
    n = dict(
        res.filter(pl.col("model") == "toy/weak")
        .select("dataset", "n")
        .unique()
        .iter_rows()
    )
    assert n == {
        "human_enhancers_cohn": 120,
        "human_nontata_promoters": 90,
        "mean": 210,
    }
    assert (res["ci_low"] <= res["value"]).all()
    assert (res["value"] <= res["ci_high"]).all()
    key = res.filter(pl.col("model") == "toy/strong")["model_key"][0]
    assert key == toy_key("toy/strong", "hf-encoder").digest


def test_accuracy_matches_predictions_and_mean_weighs_datasets_equally(evaluation):
    res = evaluation.results.filter(pl.col("metric") == "accuracy")
    row = evaluation.bootstrap.models.index("toy/strong")
    per = {}
    for d in evaluation.datasets:
        want = (evaluation.predictions[d][row] == evaluation.labels[d]).mean()
        got = res.filter((pl.col("model") == "toy/strong") & (pl.col("dataset") == d))[
            "value"
        ][0]
        assert got == pytest.approx(want)
        per[d] = want
    mean = res.filter((pl.col("model") == "toy/strong") & (pl.col("dataset") == "mean"))
    assert mean["value"][0] == pytest.approx(np.mean(list(per.values())))
    # the strong model beats chance and the weak one; majority predicts one label
    assert mean["value"][0] > 0.75
    maj = evaluation.bootstrap.models.index("majority")
    for d in evaluation.datasets:
        assert len(set(evaluation.predictions[d][maj].tolist())) == 1


def test_ranking_and_floors(evaluation):
    ranking = evaluation.ranking()
    assert ranking["model"].to_list() == ["toy/strong", "toy/weak"]
    assert ranking["rank"].to_list() == [1, 2]
    assert ranking["indistinguishable_from_best"].to_list() == [True, False]
    means = evaluation.results.filter(
        (pl.col("dataset") == "mean") & (pl.col("metric") == "accuracy")
    )
    kmers = means.filter(pl.col("model").str.starts_with("kmer"))
    best = kmers.sort("value", descending=True)["model"][0]
    assert evaluation.best_kmer().name == best
    table = leaderboard_table(evaluation)
    assert table.frame.columns[:6] == ["rank", "model", "Value", "95% CI", "n", "≠"]
    assert table.frame["≠"].to_list() == ["", ""]
    assert "not comparable to the leaderboard" in table.caption
    floors = floors_table(evaluation).frame
    other = "kmer-2" if best == "kmer-3" else "kmer-3"
    assert floors["floor"].to_list() == ["majority", f"{best} (best K)", other]


def test_neq_marks_rows_whose_n_differs(evaluation):
    odd = dataclasses.replace(
        evaluation,
        usual_n={**evaluation.usual_n, "mean": 300, "human_enhancers_cohn": 100},
    )
    assert leaderboard_table(odd).frame["≠"].to_list() == ["≠", "≠"]
    cols = dataset_table(odd).frame.columns
    assert "human_enhancers_cohn (n=120 ≠)" in cols
    assert "human_nontata_promoters (n=90)" in cols


def test_tables_and_figures_render(evaluation, tiny_subset):
    html = leaderboard_table(evaluation).to_html()
    assert "<table" in html
    assert "toy/strong" in html
    for plot in (
        accuracy_figure(evaluation),
        paired_difference_figure(evaluation),
    ):
        png, meta = plot._repr_png_()
        assert meta["alt"]
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        assert len(png) > 5000
    leak = audit_items(tiny_subset.items)
    assert leakage_table(leak).frame.height == 2
    text = caveats(evaluation, leak).text
    assert "Random train/test splits" in text
    assert "not comparable to the leaderboard" in text
    prov = dict(provenance_table(evaluation, tiny_subset).frame.iter_rows())
    assert prov["subset id"] == tiny_subset.subset_id
    assert prov["dataset human_nontata_promoters"].endswith(
        "@e0003669df0a180c8570ebe091ed91f20fa080ec"
    )
    assert "17 values, 1e-4 to 1e4 in half-decade steps" in prov["probe"]
    keys = model_keys_table(evaluation).frame
    assert "toy/weak" in keys["model"].to_list()
    comparable = dataclasses.replace(evaluation, comparable=True)
    assert "not comparable" not in leaderboard_table(comparable).caption
    assert "not comparable" not in caveats(comparable).text


def test_missing_vectors_name_count_key_and_fix(tiny_subset):
    store = DictStore()
    fill_store(store, tiny_subset.items)
    items = tiny_subset.items
    key = toy_key("toy/weak", "hf-encoder")
    for h in items["seq_sha256"][:7]:
        del store.data[key][h]
    with pytest.raises(MissingEmbeddingsError) as err:
        evaluate(tiny_subset, store, n_boot=10)
    text = str(err.value)
    assert text.startswith("7 of ")
    assert "toy/weak" in text
    assert "make embeddings MODEL=toy/weak VERSION=tiny-v1" in text
    with pytest.raises(MissingEmbeddingsError, match="MODEL=nope"):
        evaluate(tiny_subset, store, models=["nope"], n_boot=10)


def test_only_floors_in_store_ranks_kmers_for_demonstration(tiny_subset):
    store = DictStore()
    fill_store(store, tiny_subset.items, models=MODELS[2:])
    ev = evaluate(tiny_subset, store, n_boot=50)
    assert ev.fallback
    assert [e.name for e in ev.ranked] == ["kmer-2", "kmer-3"]
    assert [e.name for e in ev.floors] == ["majority"]
    assert ev.results.filter(pl.col("model") == "kmer-3")["is_floor"].all()
    assert "demonstration" in leaderboard_table(ev).note


def test_write_results_roundtrip(evaluation, tmp_path):
    path = write_results(evaluation.results, tmp_path / "r" / "results.csv")
    back = pl.read_csv(path)
    assert back.columns == list(RESULT_COLUMNS)
    assert back.height == evaluation.results.height
    assert not list(path.parent.glob(".*tmp"))


def test_end_to_end_store_cli_notebook_html(tiny_version, tiny_subset, tmp_path):
    """Real store -> `embedcache report` (papermill) -> executed notebook, results, HTML."""
    store_mod = pytest.importorskip("embedcache.store")
    from embedcache.cli import main

    store = store_mod.EmbeddingStore(tmp_path / "store")
    fill_store(store, tiny_subset.items)
    out = tmp_path / "reports"
    code = main(
        [
            "report",
            "--version",
            str(tiny_version),
            "--store",
            str(tmp_path / "store"),
            "--output-dir",
            str(out),
            "--n-boot",
            "200",
        ]
    )
    assert code == 0
    folder = out / "tiny-v1"
    results = pl.read_csv(folder / "results.csv")
    assert results.columns == list(RESULT_COLUMNS)
    board = results.filter(pl.col("metric").is_in(["accuracy", "macro_f1"]))
    assert board.height == 5 * 3 * 2
    assert set(results["metric"]) == {
        "accuracy",
        "macro_f1",
        "accuracy_clean",
        "accuracy_cluster_ci",
    }
    curves = pl.read_csv(folder / "curves.csv")
    assert curves.columns == list(CURVE_COLUMNS)
    strong = results.filter(
        (pl.col("model") == "toy/strong")
        & (pl.col("dataset") == "mean")
        & (pl.col("metric") == "accuracy")
    )
    html = (folder / "index.html").read_text()
    assert "<title>tiny-v1: Genomic Benchmarks probe leaderboard</title>" in html
    # the board first, provenance last (tests/test_sections.py checks the whole order)
    assert (
        html.index("<h1>")
        < html.index('class="ec-summary"')
        < html.index("Leaderboard (accuracy)")
        < html.index('id="per-dataset"')
        < html.index('id="caveats"')
        < html.index('id="provenance"')
    )
    assert "Leaderboard (accuracy)" in html
    assert f"{strong['value'][0]:.3f}" in html
    assert "not comparable to the leaderboard" in html
    assert "Leakage audit" in html
    assert "Caveats" in html
    assert "Leakage-clean accuracy" in html
    assert "Label efficiency" in html
    assert len(re.findall(r'<img[^>]+src="data:image/png;base64,', html)) >= 2
    assert 'alt="accuracy per dataset with 95% CI bars' in html
    assert "<script src=" not in html  # self-contained: nothing fetched
    assert not re.findall(r'(?:src|href)="https?:', html)
    assert "from embedcache" not in html  # code cells hidden
    assert (folder / "leaderboard.ipynb").exists()


def test_local_models_are_shown_and_matched_by_their_folder_alias():
    local = ModelKey(
        model_id="local",
        revision="sha256:" + "ab" * 32,
        adapter="hf-encoder",
        adapter_version="1",
    )
    other = dataclasses.replace(local, revision="sha256:" + "cd" * 32)
    aliases = {local.digest: ("my-bert", "copy-of-bert"), other.digest: ()}
    ranked, _, _ = select_models([local, other], ["my-bert"], aliases=aliases)
    assert [(e.name, e.key) for e in ranked] == [("my-bert", local)]
    # the second alias names the same key; a key without one shows its digest
    assert match_keys([local, other], "copy-of-bert", aliases=aliases) == [local]
    ranked, _, _ = select_models([local, other], aliases=aliases)
    assert sorted(e.name for e in ranked) == ["local@cdcdcdcdcdcd", "my-bert"]
