"""The report's figures: scores with CI bars, paired differences, a PCA projection.

Figures are built with ``matplotlib.figure.Figure`` directly, never through pyplot's
global state, and returned as :class:`~embedcache.report.parts.Plot`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from matplotlib.figure import Figure

from embedcache.analysis.bootstrap import MEAN, percentile_ci
from embedcache.report.parts import Plot, comparable_title

if TYPE_CHECKING:
    from collections.abc import Mapping

    from numpy.typing import NDArray

    from embedcache.analysis.evaluation import Evaluation


def accuracy_figure(evaluation: Evaluation, *, metric: str = "accuracy") -> Plot:
    """Per-dataset score with 95% CI bars for every model and floor."""
    boot = evaluation.bootstrap
    names = [e.name for e in evaluation.entries]
    panels = (*evaluation.datasets, MEAN)
    fig = Figure(figsize=(3.2 * len(panels), 0.45 * len(names) + 1.6))
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    y = np.arange(len(names))[::-1]
    for ax, name in zip(axes, panels, strict=True):
        point = boot.point(metric, name)
        low, high = percentile_ci(boot.samples(metric, name), level=boot.level)
        for j, e in enumerate(evaluation.entries):
            i = boot.models.index(e.name)
            colour = "#888888" if e.is_floor and not evaluation.fallback else "#1f77b4"
            if e.key is None:
                colour = "#888888"
            ax.errorbar(
                point[i],
                y[j],
                xerr=[[point[i] - low[i]], [high[i] - point[i]]],
                fmt="s" if e.is_floor else "o",
                color=colour,
                capsize=3,
            )
        ax.axvline(0.5, color="#cccccc", lw=1, ls="--")
        ax.set_title(f"{name}\n(n={boot.n(name)})", fontsize=9)
        ax.set_xlabel(metric.replace("_", " "))
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(y, names, fontsize=8)
    fig.suptitle(
        comparable_title(
            evaluation, f"{metric.replace('_', ' ')} per dataset, 95% bootstrap CI"
        ),
        fontsize=10,
    )
    fig.tight_layout()
    return Plot(fig, alt=f"{metric} per dataset with 95% CI bars, per model and floor")


def paired_difference_figure(
    evaluation: Evaluation, *, metric: str = "accuracy"
) -> Plot:
    """Paired bootstrap difference (model - best ranked model) of the mean, with 95% CI."""
    paired = evaluation.paired(metric=metric)
    reference = paired["reference"][0]
    diff = -paired["difference"].to_numpy()
    low, high = -paired["ci_high"].to_numpy(), -paired["ci_low"].to_numpy()
    names = paired["model"].to_list()
    same = paired["indistinguishable"].to_list()
    fig = Figure(figsize=(7, 0.4 * len(names) + 1.4))
    ax = fig.subplots()
    y = np.arange(len(names))[::-1]
    for j in range(len(names)):
        ax.errorbar(
            diff[j],
            y[j],
            xerr=[[diff[j] - low[j]], [high[j] - diff[j]]],
            fmt="o",
            color="#2ca02c" if same[j] else "#d62728",
            capsize=3,
        )
    ax.axvline(0, color="black", lw=1)
    ax.set_yticks(y, names, fontsize=8)
    ax.set_xlabel(f"mean {metric.replace('_', ' ')} minus {reference}")
    ax.set_title(
        comparable_title(
            evaluation,
            "Paired bootstrap difference to the top model (green: CI contains 0)",
        ),
        fontsize=10,
    )
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return Plot(fig, alt=f"paired bootstrap difference of mean {metric} to {reference}")


def projection_figure(
    vectors: Mapping[str, NDArray[np.floating]],
    labels: Mapping[str, NDArray[np.integer]],
    *,
    title: str = "",
) -> Plot:
    """PCA of each dataset's vectors to 2-D, points coloured by label."""
    from sklearn.decomposition import PCA
    from sklearn.preprocessing import StandardScaler

    names = list(vectors)
    fig = Figure(figsize=(4.2 * len(names), 4))
    axes = fig.subplots(1, len(names), squeeze=False)[0]
    for ax, name in zip(axes, names, strict=True):
        x = StandardScaler().fit_transform(np.asarray(vectors[name], dtype=np.float64))
        xy = PCA(n_components=2, random_state=0).fit_transform(x)
        y = np.asarray(labels[name])
        for lab, colour in ((0, "#1f77b4"), (1, "#ff7f0e")):
            pts = xy[y == lab]
            ax.scatter(
                pts[:, 0], pts[:, 1], s=6, alpha=0.5, color=colour, label=f"label {lab}"
            )
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("PC 1")
        ax.set_ylabel("PC 2")
        ax.legend(fontsize=8, markerscale=2)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return Plot(fig, alt=title or "2-D PCA projection coloured by label")
