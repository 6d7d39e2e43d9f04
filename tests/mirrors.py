"""Write small Hugging Face-layout dataset folders for tests (no hub, no network)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def random_sequences(n: int, length: int, *, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return ["".join(rng.choice(list("ACGT"), size=length)) for _ in range(n)]


def write_split(
    root: Path,
    dataset: str,
    split: str,
    seqs: list[str],
    labels: list[int],
    *,
    name: str | None = None,
) -> Path:
    """Write ``<root>/<dataset>/data/<split>-00000-of-00001.parquet`` as the hub lays it out."""
    folder = root / dataset / "data"
    folder.mkdir(parents=True, exist_ok=True)
    (root / dataset / "README.md").write_text(f"# {dataset} (test fixture)\n")
    path = folder / (name or f"{split}-00000-of-00001.parquet")
    pl.DataFrame(
        {"seq": seqs, "label": labels}, schema={"seq": pl.String, "label": pl.Int64}
    ).write_parquet(path)
    return path


def write_mirror(
    root: Path,
    dataset: str,
    *,
    n_train: int,
    n_test: int,
    length: int = 20,
    seed: int = 0,
    test_share: float = 0.5,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """A random mirror of one dataset; returns the (train, test) frames written."""
    rng = np.random.default_rng(seed)
    frames = []
    for split, n in (("train", n_train), ("test", n_test)):
        seqs = random_sequences(n, length, seed=int(rng.integers(1 << 31)))
        labels = (rng.random(n) < test_share).astype(int).tolist()
        write_split(root, dataset, split, seqs, labels)
        frames.append(pl.DataFrame({"seq": seqs, "label": labels}))
    return frames[0], frames[1]


def mirror_shared_test_file(root: Path, dataset: str) -> Path:
    """Lay out ../shared/data's real test file of ``dataset`` as a mirror's test split."""
    raw = pl.read_csv(
        SHARED_DATA / "genomic-benchmarks" / dataset / "test.tsv", separator="\t"
    )
    return write_split(
        root, dataset, "test", raw["seq"].to_list(), raw["label"].to_list()
    )
