"""Reverse-complement robustness on the demo version, and a held-out reference for kmer-4.

The reference recomputes kmer-4's accuracy_rc with numpy and scikit-learn alone
(k-mer counts of the reverse complements, the protocol's probe by GridSearchCV),
not through embedcache's model, store or probe code.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from embedcache.analysis.evaluation import evaluate
from embedcache.analysis.rc import METRIC, SUMMARY_SCHEMA, SYMMETRIC, rc_scores
from embedcache.analysis.suite import Analyses
from embedcache.data.subsets import draw_version
from embedcache.data.versions import load_version
from embedcache.engine.api import embed_version
from embedcache.store import EmbeddingStore

MODELS = (
    ("kmer-4", {}),
    ("gc", {}),
    ("kmer-1", {"rc_mode": "average"}),
)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """demo-v1 with kmer-4, gc and kmer-1 (--rc average) embedded --with-rc, kmer-2 not."""
    root = tmp_path_factory.mktemp("rc")
    store = EmbeddingStore(root / "store")
    spec = load_version("demo-v1")
    counts = {}
    for model, options in MODELS:
        _, result = embed_version(spec, model, store, with_rc=True, options=options)
        counts[model] = result
    embed_version(spec, "kmer-2", store)
    subset = draw_version(spec)
    evaluation = evaluate(subset, store, n_boot=200)
    return subset, store, evaluation, rc_scores(subset, store, evaluation), counts


def _name(evaluation, model_id, rc_mode="none"):
    return next(
        e.name
        for e in evaluation.entries
        if e.key is not None and e.key.model_id == model_id and e.key.rc_mode == rc_mode
    )


def test_with_rc_stores_the_test_items_reverse_complements_once(demo):
    subset, store, _, _, counts = demo
    n_items = subset.items.height
    n_test = subset.items.filter(pl.col("split") == "test").height
    result = counts["kmer-4"]
    assert result.vectors.shape[0] == n_items + n_test
    # a rerun is content-addressed: nothing computed
    _, again = embed_version("demo-v1", "kmer-4", store, with_rc=True)
    assert again.n_computed == 0
    assert again.n_cached == n_items + n_test


def test_strand_symmetric_models_score_the_same_on_reverse_complements(demo):
    _, _, evaluation, rc, _ = demo
    summary = rc.summary()
    results = evaluation.results.filter(pl.col("metric") == "accuracy")
    for model in (_name(evaluation, "gc"), _name(evaluation, "kmer-1", "average")):
        got = summary.filter(pl.col("model") == model).sort("dataset")
        want = results.filter(pl.col("model") == model).sort("dataset")
        assert got["value"].to_list() == want["value"].to_list()
        assert got["n"].to_list() == want["n"].to_list()
    cosine = {r["model"]: r for r in rc.cosine.iter_rows(named=True)}
    sym = cosine[_name(evaluation, "kmer-1", "average")]
    assert sym["note"] == SYMMETRIC
    assert sym["cos_median"] is None
    assert cosine[_name(evaluation, "gc")]["cos_p5"] == pytest.approx(1.0)
    kmer4 = cosine[_name(evaluation, "kmer-4")]
    assert 0 < kmer4["cos_p5"] < kmer4["cos_median"] < 1  # k-mer spectra are stranded


def test_models_without_reverse_complements_are_listed_not_scored(demo):
    _, _, evaluation, rc, _ = demo
    assert _name(evaluation, "kmer-2") in rc.missing
    assert _name(evaluation, "kmer-2") not in rc.summary()["model"].to_list()
    flags = rc.against_accuracy(evaluation)
    assert set(flags["model"]) == set(rc.models)
    assert not flags.filter(pl.col("model") == _name(evaluation, "gc"))[
        "excludes_accuracy"
    ].item()


def test_accuracy_rc_rows_follow_the_existing_rows_with_the_same_columns(demo):
    _, _, evaluation, rc, _ = demo
    analyses = Analyses.__new__(Analyses)  # only results() is exercised here
    object.__setattr__(analyses, "rc", rc)
    object.__setattr__(analyses, "clean", _Empty())
    object.__setattr__(analyses, "clustered", _Empty(results=True))
    frame = Analyses.results(analyses, evaluation)
    assert frame.columns == evaluation.results.columns
    assert frame.head(evaluation.results.height).equals(evaluation.results)
    rc_rows = frame.filter(pl.col("metric") == METRIC)
    assert rc_rows.height == len(rc.models) * (len(evaluation.datasets) + 1)
    assert frame.tail(rc_rows.height)["metric"].unique().to_list() == [METRIC]


class _Empty:
    def __init__(self, *, results=False):
        self._frame = pl.DataFrame(schema=SUMMARY_SCHEMA)

    def summary(self):
        return self._frame

    def results_summary(self):
        return self._frame


# --- the held-out reference: numpy + scikit-learn only -----------------------------

_COMP = str.maketrans("ACGTN", "TGCAN")


def _spectrum(seq: str, k: int) -> np.ndarray:
    """Normalised k-mer counts (A<C<G<T order, k-mers holding N skipped), by numpy."""
    code = np.frombuffer(seq.encode(), dtype=np.uint8)
    digits = np.full(code.shape, -1)
    for value, base in enumerate(b"ACGT"):
        digits[code == base] = value
    windows = np.lib.stride_tricks.sliding_window_view(digits, k)
    ok = (windows >= 0).all(axis=1)
    index = windows[ok] @ (4 ** np.arange(k - 1, -1, -1))
    counts = np.bincount(index, minlength=4**k).astype(np.float64)
    return counts / counts.sum() if counts.sum() else counts


def _reference_accuracy_rc(subset, k: int = 4) -> float:
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV, StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from threadpoolctl import threadpool_limits

    accs = []
    for d in subset.version.dataset_names:
        part = subset.items.filter(pl.col("dataset") == d)
        train = part.filter(pl.col("split") == "train")
        test = part.filter(pl.col("split") == "test")
        x_train = np.stack([_spectrum(s.upper(), k) for s in train["seq"]])
        rc = [s.upper().translate(_COMP)[::-1] for s in test["seq"]]
        x_rc = np.stack([_spectrum(s, k) for s in rc])
        search = GridSearchCV(
            make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000)),
            {"logisticregression__C": np.logspace(-4, 4, 17)},
            scoring="neg_log_loss",
            cv=StratifiedKFold(5, shuffle=True, random_state=0),
        )
        with threadpool_limits(limits=1):  # BLAS threads only slow 500-row fits
            search.fit(x_train, train["label"].to_numpy())
        accs.append(float(np.mean(search.predict(x_rc) == test["label"].to_numpy())))
    return float(np.mean(accs))


def test_kmer4_accuracy_rc_matches_an_independent_computation(demo):
    subset, _, evaluation, rc, _ = demo
    ours = (
        rc.summary()
        .filter(
            (pl.col("model") == _name(evaluation, "kmer-4"))
            & (pl.col("dataset") == "mean")
        )["value"]
        .item()
    )
    reference = _reference_accuracy_rc(subset)
    assert abs(ours - reference) <= 0.01, (ours, reference)
