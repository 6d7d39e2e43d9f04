"""The analyses at atlas-full-v1 size: leakage audits, test clusters, cluster/clean CIs, curves.

Sizes: the largest dataset (demo_coding_vs_intergenomic_seqs) has 25,000 test items of
200 bp, 500 drawn train items and 75,000 items in its full published train file.

1. Leakage audit 25,000 x 500 (both strands, Jaccard + containment): the inverted-index
   kernel against the dense sparse-product blocks it replaced, side by side.
2. Full-train audit 25,000 x 75,000 and the near-duplicate clusters of 25,000 test
   items, on random 200 bp sequences and on 200 bp windows cut from the real test
   sequences in ../shared/data (real k-mer skew and many true near duplicates).
3. The real test files (6,948 and 9,034 items): their cluster counts.
4. Clean + cluster bootstrap for 3 datasets (6,948 / 9,034 / 25,000), 10 models.
5. Label-efficiency probes: n_train 10..500 on 256-d vectors, the protocol's 17 C values.

Run: .venv/bin/python benchmarks/leakage_bench.py [--shared ../shared/data] [--quick]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import polars as pl

from embedcache.analysis.bootstrap import bootstrap_scores, cluster_bootstrap_scores
from embedcache.analysis.clusters import near_duplicate_clusters
from embedcache.analysis.leakage import audit_sequences, kmer_set_matrix
from embedcache.analysis.paired import subset_gap
from embedcache.analysis.probe import ProbeConfig, fit_probe
from embedcache.hashing import reverse_complement

DATASETS = {
    "human_enhancers_cohn": 6_948,
    "human_nontata_promoters": 9_034,
    "demo_coding_vs_intergenomic_seqs": 25_000,
}
GRID = tuple(float(c) for c in np.logspace(-4, 4, 17))  # PROTOCOL.md's fixed grid


def random_seqs(rng: np.random.Generator, n: int, length: int = 200) -> list[str]:
    letters = np.frombuffer(b"ACGT", dtype=np.uint8)
    codes = letters[rng.integers(0, 4, (n, length))]
    return [row.tobytes().decode("ascii") for row in codes]


def windows(
    rng: np.random.Generator, source: list[str], n: int, length: int = 200
) -> list[str]:
    """Random ``length`` windows of random source sequences, on a random strand."""
    out = []
    for i in rng.integers(0, len(source), n):
        s = source[i]
        start = int(rng.integers(0, len(s) - length + 1))
        w = s[start : start + length]
        out.append(reverse_complement(w) if rng.random() < 0.5 else w)
    return out


def dense_audit(train: list[str], test: list[str], block: int = 4096) -> np.ndarray:
    """The replaced method: exact Jaccard by dense blocks of a sparse product."""
    train_m = kmer_set_matrix(train)
    size_train = np.diff(train_m.indptr).astype(np.float64)
    train_t = train_m.T.tocsc()
    best = np.zeros(len(test))
    for strand in (test, [reverse_complement(s) for s in test]):
        m = kmer_set_matrix(strand)
        for start in range(0, m.shape[0], block):
            part = m[start : start + block]
            inter = (part @ train_t).toarray().astype(np.float64)
            size = np.diff(part.indptr).astype(np.float64)
            union = size[:, None] + size_train[None, :] - inter
            jac = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
            best[start : start + part.shape[0]] = np.maximum(
                best[start : start + part.shape[0]], jac.max(axis=1)
            )
    return best


def timed(label: str, func, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN201
    t0 = time.perf_counter()
    out = func(*args, **kwargs)
    dt = time.perf_counter() - t0
    print(f"{label:<62} {dt:8.2f} s", flush=True)
    return out, dt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shared",
        type=Path,
        default=Path(__file__).resolve().parents[2] / "shared" / "data",
        help="the shared data folder (real test files); skipped where absent",
    )
    parser.add_argument(
        "--quick", action="store_true", help="skip the 25,000 x 75,000 runs"
    )
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"load average {os.getloadavg()}, {os.cpu_count()} cores")

    # warm the numba kernels (compiled once, cached after)
    audit_sequences(random_seqs(rng, 20), random_seqs(rng, 20))
    near_duplicate_clusters(random_seqs(rng, 20))

    print("-- 1. leakage audit 25,000 test x 500 train, random 200 bp")
    test = random_seqs(rng, 25_000)
    train = random_seqs(rng, 500)
    flags, t_new = timed(
        "inverted-index kernel (Jaccard + containment)", audit_sequences, train, test
    )
    best, t_old = timed(
        "dense sparse-product blocks (Jaccard only, replaced)", dense_audit, train, test
    )
    assert np.allclose(best, flags.max_jaccard)
    print(f"ratio dense / kernel: {t_old / t_new:.1f}x (same max Jaccard per item)")

    real: list[str] = []
    root = args.shared / "genomic-benchmarks"
    real_files = {}
    for name in ("human_enhancers_cohn", "human_nontata_promoters"):
        path = root / name / "test.tsv"
        if path.exists():
            real_files[name] = pl.read_csv(path, separator="\t")["seq"].to_list()
            real += real_files[name]
    if not args.quick:
        print("-- 2. full-train audit 25,000 x 75,000 and test clusters of 25,000")
        full_train = random_seqs(rng, 75_000)
        flags, _ = timed(
            "random 200 bp: full-train audit", audit_sequences, full_train, test
        )
        print(
            f"   near {int(flags.near.sum())}, contained {int(flags.containment.sum())}"
        )
        labels, _ = timed(
            "random 200 bp: clusters of 25,000 test items",
            near_duplicate_clusters,
            test,
        )
        print(f"   {labels.max() + 1} clusters")
        if real:
            w_test = windows(rng, real, 25_000)
            w_train = windows(rng, real, 75_000)
            flags, _ = timed(
                "real-sequence windows: full-train audit",
                audit_sequences,
                w_train,
                w_test,
            )
            print(
                f"   near {int(flags.near.sum())} ({flags.near.mean():.1%}), contained "
                f"{int(flags.containment.sum())} ({flags.containment.mean():.1%})"
            )
            labels, _ = timed(
                "real-sequence windows: clusters of 25,000 test items",
                near_duplicate_clusters,
                w_test,
            )
            print(
                f"   {labels.max() + 1} clusters, largest {np.bincount(labels).max()}"
            )
        else:
            print(f"   real-sequence runs skipped: {root} absent")

    print("-- 3. clusters of the real published test files")
    for name, seqs in real_files.items():
        labels, _ = timed(
            f"{name} ({len(seqs):,} items)", near_duplicate_clusters, seqs
        )
        sizes = np.bincount(labels)
        print(
            f"   {labels.max() + 1:,} clusters, {int((sizes > 1).sum())} with 2+ items, "
            f"largest {sizes.max()}"
        )
    if not real_files:
        print(f"   skipped: {root} absent")

    print("-- 4. clean + cluster bootstrap, 3 datasets, 10 models, 1000 resamples")
    models = [f"m{i}" for i in range(10)]
    y, preds, masks, clusters = {}, {}, {}, {}
    for name, n in DATASETS.items():
        y[name] = rng.integers(0, 2, n)
        preds[name] = np.where(rng.random((10, n)) < 0.8, y[name], 1 - y[name])
        masks[name] = rng.random(n) > 0.05
        clusters[name] = (np.arange(n) * 0.8).astype(np.int64)  # 20% in pairs
    timed("item bootstrap (the board's)", bootstrap_scores, y, preds, models)
    timed(
        "clean bootstrap (clean items only)",
        bootstrap_scores,
        {d: y[d][masks[d]] for d in y},
        {d: preds[d][:, masks[d]] for d in y},
        models,
    )
    timed("cluster bootstrap", cluster_bootstrap_scores, y, preds, clusters, models)
    timed(
        "paired gap accuracy - clean, item resamples",
        subset_gap,
        y,
        preds,
        masks,
        models,
    )
    timed(
        "paired gap accuracy - clean, cluster resamples",
        subset_gap,
        y,
        preds,
        masks,
        models,
        clusters=clusters,
    )

    print("-- 5. label-efficiency probes (17 C values), 256-d, per model and dataset")
    config = ProbeConfig(c_grid=GRID)
    y_train = rng.integers(0, 2, 500)
    x = rng.normal(size=(500, 256)).astype(np.float32)
    x[:, :4] += 0.8 * (2 * y_train[:, None] - 1)
    total = 0.0
    for n in (10, 20, 50, 100, 200):
        idx = np.concatenate(
            [np.flatnonzero(y_train == lab)[: n // 2] for lab in (0, 1)]
        )
        _, dt = timed(f"n_train={n}", fit_probe, x[idx], y_train[idx], config=config)
        total += dt
    _, dt500 = timed(
        "n_train=500 (the board's own fit, reused by the curves)",
        fit_probe,
        x,
        y_train,
        config=config,
    )
    print(
        f"curves cost per model and dataset: {total:.2f} s beside the board's "
        f"{dt500:.2f} s; x 3 datasets = {3 * total:.1f} s a model"
    )


if __name__ == "__main__":
    main()
