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
# # Explore one model's embeddings
#
# Open in JupyterLab (`jupytext --to ipynb notebooks/explore.py`, or open the `.py` as a
# notebook). Change the parameters and re-run.

# %% tags=["parameters"]
version = "demo-v1"
store = "store"
model = "kmer-4"
data_dir = None
split = "test"

# %%
from embedcache.analysis import evaluation as leaderboard
from embedcache.data.subsets import draw_version
from embedcache.data.versions import load_version
from embedcache.report import tables as report
from embedcache.store import EmbeddingStore

spec = load_version(version)
subset = draw_version(spec, data_dir=data_dir)
emb_store = EmbeddingStore(store, create=False)
vectors, labels = leaderboard.model_vectors(subset, emb_store, model, split=split)
report.Html(
    f"<p>{model} on {version} ({split} items): "
    + ", ".join(f"{d} {v.shape}" for d, v in vectors.items())
    + "</p>"
)

# %%
report.projection_figure(vectors, labels, title=f"{model}, PCA of {split} vectors")

# %%
evaluation = leaderboard.evaluate(subset, emb_store, models=[model], n_boot=200)
report.dataset_table(evaluation)

# %%
errors = {
    d: leaderboard.probe_errors(evaluation, model, d) for d in evaluation.datasets
}
report.Table(
    leaderboard.errors_summary(errors),
    f"{model}: test items its probe got wrong",
)

# %%
d = evaluation.datasets[0]
report.Table(
    errors[d].join(subset.items.select("item_id", "seq"), on="item_id").head(20),
    f"{model}: first 20 misclassified test items of {d}",
)
