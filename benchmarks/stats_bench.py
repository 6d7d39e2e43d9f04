"""Probes + bootstrap + paired tests for an atlas-full-v1-sized version.

Three datasets of 6,948 / 9,034 / 25,000 test items (40,982 in all) and 500 train
items each; random vectors with a planted signal: 3 models of 256 dims, floors of
4 / 16 / 64 / 256 dims (k-mer-1..4 sized) and the majority class. Times the
vectorised statistics against a naive per-resample Python loop (sklearn metrics on
index-resampled arrays) in the same run. The naive loop runs fewer resamples and is
extrapolated linearly to 1,000 (said in its output).

Run: .venv/bin/python benchmarks/stats_bench.py [--naive-resamples 20]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from sklearn.metrics import accuracy_score, f1_score

from embedcache.analysis.bootstrap import bootstrap_scores, percentile_ci
from embedcache.analysis.leakage import audit_sequences
from embedcache.analysis.paired import paired_differences, significance_ranks
from embedcache.analysis.probe import fit_probe, majority_label

DATASETS = {
    "human_enhancers_cohn": 6_948,
    "human_nontata_promoters": 9_034,
    "demo_coding_vs_intergenomic_seqs": 25_000,
}
N_TRAIN = 500
MODELS = {"model-a": (256, 0.9), "model-b": (256, 0.85), "model-c": (256, 0.5)}
FLOORS = {
    "kmer-1": (4, 0.2),
    "kmer-2": (16, 0.3),
    "kmer-3": (64, 0.4),
    "kmer-4": (256, 0.4),
}
N_BOOT = 1000


def make_vectors(
    rng: np.random.Generator, y: np.ndarray, dim: int, signal: float
) -> np.ndarray:
    x = rng.normal(size=(y.size, dim)).astype(np.float32)
    x[:, :4] += signal * (2 * y[:, None] - 1)
    return x


def naive_bootstrap(
    labels: dict[str, np.ndarray],
    preds: dict[str, np.ndarray],
    names: list[str],
    n_boot: int,
    seed: int,
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """One Python iteration per resample; sklearn metrics on index-resampled arrays."""
    acc = {d: np.empty((n_boot, len(names))) for d in labels}
    f1 = {d: np.empty((n_boot, len(names))) for d in labels}
    for d, y in labels.items():
        rng = np.random.default_rng([seed, len(d)])
        for b in range(n_boot):
            idx = rng.integers(0, y.size, y.size)
            for m in range(len(names)):
                acc[d][b, m] = accuracy_score(y[idx], preds[d][m, idx])
                f1[d][b, m] = f1_score(y[idx], preds[d][m, idx], average="macro")
    mean_acc = np.mean(list(acc.values()), axis=0)
    best = int(np.argmax(mean_acc.mean(axis=0)))
    diff = mean_acc[:, [best]] - mean_acc
    return percentile_ci(mean_acc), percentile_ci(diff)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--naive-resamples", type=int, default=20)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    names = [*MODELS, *FLOORS, "majority"]
    specs = {**MODELS, **FLOORS}
    n_test = sum(DATASETS.values())
    print(
        f"version: {len(DATASETS)} datasets, {n_test:,} test items, {N_TRAIN} train each"
    )
    print(
        f"models: {len(MODELS)} x 256-d + floors {list(FLOORS)} + majority; {N_BOOT} resamples"
    )

    t0 = time.perf_counter()
    labels, train_labels, inputs = {}, {}, {}
    for d, n in DATASETS.items():
        y = rng.integers(0, 2, N_TRAIN + n)  # every model sees the same items
        labels[d] = y[N_TRAIN:]
        train_labels[d] = y[:N_TRAIN]
        inputs[d] = [make_vectors(rng, y, *specs[name]) for name in names[:-1]]
    t_data = time.perf_counter() - t0

    t0 = time.perf_counter()
    preds = {}
    for d, n in DATASETS.items():
        rows = []
        for x in inputs[d]:
            fit = fit_probe(x[:N_TRAIN], train_labels[d])
            rows.append(fit.predict(x[N_TRAIN:]))
        rows.append(np.full(n, majority_label(train_labels[d])))
        preds[d] = np.stack(rows)
    t_probe = time.perf_counter() - t0
    n_probes = len(DATASETS) * (len(names) - 1)

    t0 = time.perf_counter()
    boot = bootstrap_scores(labels, preds, names, n_boot=N_BOOT, seed=0)
    t_boot = time.perf_counter() - t0
    t0 = time.perf_counter()
    summary = boot.summary()
    paired = paired_differences(boot)
    ranks = significance_ranks(boot.samples("accuracy")[:, : len(MODELS)])
    t_paired = time.perf_counter() - t0
    t_vec = t_boot + t_paired

    k = args.naive_resamples
    t0 = time.perf_counter()
    naive_bootstrap(labels, preds, names, k, seed=0)
    t_naive_k = time.perf_counter() - t0
    t_naive = t_naive_k * N_BOOT / k

    print(f"data generation            {t_data:7.2f} s (not counted)")
    print(f"probes ({n_probes} fits, 5-fold CV, 7 C) {t_probe:7.2f} s")
    print(
        f"vectorised bootstrap       {t_boot:7.2f} s  ({N_BOOT} resamples, acc + macro F1)"
    )
    print(f"CIs + paired diffs + ranks {t_paired:7.2f} s")
    print(f"whole thing (probes+stats) {t_probe + t_vec:7.2f} s  (goal < 10 s)")
    print(
        f"naive loop                 {t_naive:7.2f} s  (measured {t_naive_k:.2f} s for {k} "
        f"resamples, extrapolated linearly to {N_BOOT})"
    )
    print(f"ratio naive / vectorised statistics: {t_naive / t_vec:,.0f}x")
    # Leakage audit at the largest dataset's size (random 200 bp sequences).
    letters = np.array(list("ACGT"))
    test = ["".join(r) for r in letters[rng.integers(0, 4, (25_000, 200))]]
    train = ["".join(r) for r in letters[rng.integers(0, 4, (N_TRAIN, 200))]]
    t0 = time.perf_counter()
    flags = audit_sequences(train, test)
    t_leak = time.perf_counter() - t0
    print(
        f"leakage audit 25,000 x {N_TRAIN} (exact Jaccard, 8-mers, both strands) "
        f"{t_leak:5.2f} s  ({int(flags.near.sum())} near duplicates; not in the goal)"
    )
    mean = summary.filter(
        (summary["dataset"] == "mean") & (summary["metric"] == "accuracy")
    )
    for row in mean.iter_rows(named=True):
        print(
            f"  {row['model']:<10} {row['value']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}]"
        )
    print(f"ranks of {list(MODELS)}: {ranks.tolist()}")
    print(
        f"indistinguishable from best: {paired.filter(paired['indistinguishable'])['model'].to_list()}"
    )


if __name__ == "__main__":
    main()
