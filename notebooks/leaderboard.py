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

# %% [markdown]
# # Genomic Benchmarks probe leaderboard
#
# Frozen, mean-pooled embeddings probed with a logistic head (PROTOCOL.md). Rendered by
# `make report VERSION=...`; never hand-edited.

# %% tags=["parameters"]
version = "demo-v1"
store = "store"
models = []  # empty: every non-floor model in the store
data_dir = None
n_boot = 1000
seed = 0
results_csv = None  # set by `embedcache report`: where to write results.csv

# %%
from embedcache import leaderboard, report
from embedcache.leakage import audit_items
from embedcache.store import EmbeddingStore
from embedcache.subsets import draw_version
from embedcache.versions import load_version

spec = load_version(version)
subset = draw_version(spec, data_dir=data_dir)
emb_store = EmbeddingStore(store, create=False)
evaluation = leaderboard.evaluate(
    subset, emb_store, models=models, n_boot=n_boot, seed=seed
)
leakage = audit_items(subset.items)
if results_csv:
    leaderboard.write_results(evaluation.results, results_csv)
report.run_header(
    parameters={
        "version": version,
        "store": store,
        "models": models,
        "data_dir": data_dir,
        "n_boot": n_boot,
        "seed": seed,
    },
    store_keys=emb_store.keys(),
)

# %%
report.banner(evaluation)

# %%
report.leaderboard_table(evaluation)

# %%
report.dataset_table(evaluation)

# %%
report.leaderboard_table(evaluation, metric="macro_f1")

# %%
report.dataset_table(evaluation, metric="macro_f1")

# %%
report.floors_table(evaluation)

# %%
report.accuracy_figure(evaluation)

# %%
report.paired_difference_figure(evaluation)

# %%
report.leakage_table(leakage)

# %%
report.caveats(evaluation, leakage)

# %%
report.probe_table(evaluation)

# %%
report.provenance_table(evaluation, subset)

# %% [markdown]
# ## Analyses: leakage-clean accuracy, cluster-aware intervals, label efficiency, pretraining gain, layers

# %%
from pathlib import Path

from embedcache import report_analyses
from embedcache.analyses import run_analyses
from embedcache.curves import write_curves

analyses = run_analyses(subset, emb_store, evaluation, data_dir=data_dir)
if results_csv:
    # the board's rows plus accuracy_clean and accuracy_cluster_ci rows
    leaderboard.write_results(analyses.results(evaluation), results_csv)
    write_curves(analyses.curves.frame, Path(results_csv).with_name("curves.csv"))
report_analyses.clean_table(evaluation, analyses)

# %%
report_analyses.clean_dataset_table(evaluation, analyses)

# %%
report_analyses.leakage_audit_table(analyses)

# %%
report_analyses.full_train_table(analyses)

# %%
report_analyses.cluster_table(evaluation, analyses)

# %%
report_analyses.cluster_paired_table(evaluation, analyses)

# %%
report_analyses.curves_table(evaluation, analyses)

# %%
report_analyses.curves_figure(evaluation, analyses)

# %%
report_analyses.pretraining_table(evaluation, analyses)

# %%
report_analyses.layers_table(evaluation, analyses)

# %%
report_analyses.timings_table(analyses)
