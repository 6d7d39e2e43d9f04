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
server = None  # a running `embedcache serve` URL: see "Through the service" below
api_key = None

# %%
from embedcache.analysis.evaluation import errors_summary, evaluate, probe_errors
from embedcache.analysis.vectors import model_vectors
from embedcache.data.subsets import draw_version
from embedcache.data.versions import load_version
from embedcache.report.figures import projection_figure
from embedcache.report.parts import Html, Table
from embedcache.report.tables import dataset_table
from embedcache.store import EmbeddingStore

spec = load_version(version)
subset = draw_version(spec, data_dir=data_dir)
emb_store = EmbeddingStore(store, create=False)
vectors, labels = model_vectors(subset, emb_store, model, split=split)
Html(
    f"<p>{model} on {version} ({split} items): "
    + ", ".join(f"{d} {v.shape}" for d, v in vectors.items())
    + "</p>"
)

# %% [markdown]
# ## Through the service
#
# With `server` set, the lab's `embedcache serve` answers instead of a model loaded here
# (docs/serve/index.md): the first items' vectors, and what its store already held.

# %%
if server:
    from embedcache.client import EmbedClient

    with EmbedClient(server, api_key=api_key) as client:
        served = client.embed_items(subset.items["seq"].head(8).to_list(), model=model)
    Html(
        f"<p>{server} served {served.vectors.shape} for {model} (key "
        f"{served.key_digest[:12]}): computed={served.n_computed} "
        f"cached={served.n_cached}</p>"
    )

# %%
projection_figure(vectors, labels, title=f"{model}, PCA of {split} vectors")

# %%
evaluation = evaluate(subset, emb_store, models=[model], n_boot=200)
dataset_table(evaluation)

# %%
errors = {d: probe_errors(evaluation, model, d) for d in evaluation.datasets}
Table(
    errors_summary(errors),
    f"{model}: test items its probe got wrong",
)

# %%
d = evaluation.datasets[0]
Table(
    errors[d].join(subset.items.select("item_id", "seq"), on="item_id").head(20),
    f"{model}: first 20 misclassified test items of {d}",
)
