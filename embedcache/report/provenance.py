"""Where a report's numbers come from: run parameters, store keys, provenance, model keys."""

from __future__ import annotations

import subprocess
from dataclasses import fields
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from embedcache import __version__
from embedcache.report.parts import NOT_COMPARABLE, Table
from embedcache.report.tables import probe_description

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from embedcache.analysis.evaluation import Evaluation
    from embedcache.data.subsets import Subset


def git_commit(path: Path | None = None) -> str:
    """The git commit of the source tree at ``path`` (default: this package), or "unknown"."""
    where = path or Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=where,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = out.stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=where,
        capture_output=True,
        text=True,
        check=False,
        timeout=10,
    ).stdout.strip()
    return f"{commit} (uncommitted changes)" if dirty else commit


def run_table(parameters: Mapping[str, Any]) -> Table:
    """The notebook's parameters, package version and git commit."""
    rows = [("embedcache version", __version__), ("git commit", git_commit())]
    rows += [(name, repr(value)) for name, value in parameters.items()]
    return Table(
        pl.DataFrame(rows, schema=["parameter", "value"], orient="row"),
        "Run parameters",
        css_class="embedcache wrap",
    )


def store_keys_table(store_keys: Sequence[Any]) -> Table:
    """Every key in the store: digest, model, the options that set it apart, counts."""
    rows = []
    for info in store_keys:
        key = getattr(info, "key", info)
        rows.append(
            {
                "key digest": key.digest[:12],
                "model": key.model_id,
                "revision": key.revision[:19],
                "adapter": key.adapter,
                "rc mode": key.rc_mode,
                "dtype": key.dtype,
                "vectors": getattr(info, "n_vectors", None),
                "dim": getattr(info, "dim", None),
            }
        )
    frame = pl.DataFrame(
        rows,
        schema={
            "key digest": pl.Utf8,
            "model": pl.Utf8,
            "revision": pl.Utf8,
            "adapter": pl.Utf8,
            "rc mode": pl.Utf8,
            "dtype": pl.Utf8,
            "vectors": pl.Int64,
            "dim": pl.Int64,
        },
    )
    return Table(
        frame,
        "Store keys",
        "Every key in the store, scored or not; the full key of each scored model is "
        "under Provenance.",
    )


def provenance_table(
    evaluation: Evaluation, subset: Subset, *, created: datetime | None = None
) -> Table:
    """Dataset sources, revisions and file hashes, subset id, versions, probe, date."""
    from embedcache.data.datasets import dataset_spec

    rows: list[tuple[str, str]] = [
        (
            "version",
            evaluation.version
            + ("" if evaluation.comparable else f" ({NOT_COMPARABLE})"),
        ),
        ("subset id", evaluation.subset_id),
    ]
    for name in evaluation.datasets:
        spec = dataset_spec(name)
        rows.append((f"dataset {name}", f"{spec.repo_id}@{spec.revision}"))
    for record in subset.provenance():
        files = (
            ", ".join(f"{f['name']} sha256 {f['sha256']}" for f in record["files"])
            or "-"
        )
        rows.append(
            (
                f"source {record['dataset']}/{record['split']}",
                f"{record['source']}: {files}",
            )
        )
    rows += [
        ("embedcache version", __version__),
        ("git commit", git_commit()),
        ("probe", probe_description(evaluation.probe_config)),
        (
            "bootstrap",
            (
                f"{evaluation.bootstrap.n_boot} resamples of test items within each "
                f"dataset, seed {evaluation.seed}"
            ),
        ),
        ("date", _fmt_date(created)),
    ]
    return Table(
        pl.DataFrame(rows, schema=["field", "value"], orient="row"),
        "Provenance",
        css_class="embedcache wrap",  # long file hashes wrap instead of widening the page
    )


def _fmt_date(when: datetime | None) -> str:
    return (when or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M UTC")


def model_keys_table(evaluation: Evaluation) -> Table:
    """The full key of every scored model and k-mer floor: one row each, one column a field."""
    from embedcache.specs import ModelKey

    names = [f.name for f in fields(ModelKey)]
    rows = []
    for e in evaluation.entries:
        if e.key is None:
            continue
        row = {"model": e.name}
        for name in names:
            value = getattr(e.key, name)
            if name == "options":
                value = ", ".join(f"{k}={v}" for k, v in value) or "-"
            row[name] = "-" if value is None else str(value)
        row["key digest"] = e.key.digest
        rows.append(row)
    frame = pl.DataFrame(
        rows, schema=dict.fromkeys(["model", *names, "key digest"], pl.Utf8)
    )
    return Table(
        frame,
        "Model keys",
        "Everything that changes a vector; the store names a key by the sha256 of its "
        "canonical JSON (the key digest). The majority floor has no key.",
    )
