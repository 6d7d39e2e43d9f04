# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% tags=["parameters"]
# Genomic Benchmarks probe leaderboard: frozen, mean-pooled embeddings probed with a
# logistic head (PROTOCOL.md). Rendered by `make report VERSION=...`; never hand-edited.
# The page's layout (sections, order, contents) lives in embedcache/report/sections.py.
version = "demo-v1"
store = "store"
models = []  # empty: every non-floor model in the store
data_dir = None
n_boot = 1000
seed = 0
results_csv = None  # set by `embedcache report`: where to write results.csv
overlap = None  # a TOML of declared pretraining corpora (`embedcache report --overlap`)

# %%
from pathlib import Path

from embedcache.analysis.curves import write_curves
from embedcache.analysis.evaluation import evaluate
from embedcache.analysis.leakage import audit_table
from embedcache.analysis.predictions import predictions_frame, write_predictions
from embedcache.analysis.results import write_results
from embedcache.analysis.suite import run_analyses
from embedcache.data.subsets import draw_version
from embedcache.data.versions import load_version
from embedcache.report import sections
from embedcache.report.overlap import read_declarations
from embedcache.store import EmbeddingStore

spec = load_version(version)
subset = draw_version(spec, data_dir=data_dir)
emb_store = EmbeddingStore(store, create=False)
evaluation = evaluate(subset, emb_store, models=models, n_boot=n_boot, seed=seed)
# leakage-clean accuracy, cluster CIs, curves, pretraining gain, layer sweep
analyses = run_analyses(subset, emb_store, evaluation, data_dir=data_dir)
if results_csv:
    # the board's rows plus the accuracy_clean and accuracy_cluster_ci rows
    write_results(analyses.results(evaluation), results_csv)
    write_curves(analyses.curves.frame, Path(results_csv).with_name("curves.csv"))
    # one row per (model, test item): accuracy from it equals results.csv's
    write_predictions(
        predictions_frame(evaluation, analyses.audits),
        Path(results_csv).with_name("predictions.parquet"),
    )
context = sections.ReportContext(
    evaluation=evaluation,
    subset=subset,
    leakage=audit_table(analyses.audits),
    analyses=analyses,
    parameters={
        "version": version,
        "store": store,
        "models": models,
        "data_dir": data_dir,
        "n_boot": n_boot,
        "seed": seed,
    },
    store_keys=emb_store.keys(),
    declared=read_declarations(overlap) if overlap else {},
)

# %%
sections.page(context)
