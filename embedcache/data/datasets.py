"""Load the pinned Genomic Benchmarks splits as validated polars frames.

Three sources, one interface: the Hugging Face hub at the pinned revision (through the
hub client's cache, so ``HF_HUB_OFFLINE=1`` works from a warm cache), a local mirror laid
out as ``hf download ... --local-dir <dir>/<dataset>`` leaves it, and the demo data
bundled with the package.
"""

from __future__ import annotations

import hashlib
import logging
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from embedcache.errors import (
    ChecksumMismatchError,
    DataUnavailableError,
    InvalidLabelError,
    InvalidSequenceError,
    VersionSpecError,
)
from embedcache.hashing import sequence_key

if TYPE_CHECKING:
    import polars as pl

logger = logging.getLogger(__name__)

PACKAGE_DIR = Path(__file__).parent
DEMO_DATA_DIR = PACKAGE_DIR / "demo"
_VALID_SEQUENCE = r"^[ACGTN]+$"


@dataclass(frozen=True, slots=True)
class DatasetSpec:
    """One Genomic Benchmarks dataset, pinned to a commit of its hub repo."""

    name: str
    repo_id: str
    revision: str
    length: int
    label_0: str
    label_1: str
    n_train: int
    n_test: int
    sha256: dict[str, str] = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True, slots=True)
class SplitData:
    """A validated split: one row per published row, plus where it came from."""

    dataset: str
    split: str
    frame: pl.DataFrame  # item_id, dataset, split, row, seq, label, seq_sha256
    source: str  # "hub <repo>@<rev>", "mirror <dir>" or "bundled demo data"
    files: tuple[tuple[str, str], ...]  # (file name, sha256)


@cache
def dataset_specs() -> dict[str, DatasetSpec]:
    """The catalogue of pinned datasets shipped in ``datasets.toml``."""
    with (PACKAGE_DIR / "datasets.toml").open("rb") as fh:
        raw = tomllib.load(fh)
    return {name: DatasetSpec(name=name, **entry) for name, entry in raw.items()}


def dataset_spec(name: str) -> DatasetSpec:
    specs = dataset_specs()
    if name not in specs:
        msg = f"unknown dataset {name!r}; known datasets: {', '.join(sorted(specs))}"
        raise VersionSpecError(msg)
    return specs[name]


def make_item_id(dataset: str, split: str, row: int) -> str:
    """``<dataset>:<split>:<row>``, row zero-padded to 6 digits (PROTOCOL.md)."""
    return f"{dataset}:{split}:{row:06d}"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def mirror_command(spec: DatasetSpec, data_dir: Path | str = "<DIR>") -> str:
    """The exact command that lays out a local mirror of ``spec`` under ``data_dir``."""
    return (
        f"hf download {spec.repo_id} --repo-type dataset --revision {spec.revision} "
        f"--local-dir {data_dir}/{spec.name}"
    )


def load_split(
    dataset: str,
    split: str,
    *,
    data_dir: Path | None = None,
    source: str = "auto",
) -> SplitData:
    """Load one split of a pinned dataset, verified and validated.

    Parameters
    ----------
    dataset, split
        A dataset of ``datasets.toml`` and a published split (``train``, ``test``; the
        bundled demo data has ``demo``).
    data_dir
        A local mirror: ``<data_dir>/<dataset>/data/<split>-*.parquet``.
    source
        ``"auto"`` (mirror when ``data_dir`` is given, else the hub), ``"hub"``,
        ``"mirror"`` or ``"demo"``.

    Raises
    ------
    DataUnavailableError
        Nothing found locally and the hub cannot be reached; says how to make a mirror.
    ChecksumMismatchError
        A file's sha256 differs from its pin.
    InvalidSequenceError, InvalidLabelError
        A row fails validation; the message names the item.
    """
    spec = dataset_spec(dataset)
    if source == "auto":
        source = "mirror" if data_dir is not None else "hub"
    if source == "demo":
        files = _local_files(
            DEMO_DATA_DIR / dataset, split, spec=spec, where="bundled demo data"
        )
        origin = "bundled demo data (not comparable to the leaderboard)"
    elif source == "mirror":
        if data_dir is None:
            msg = f"source 'mirror' for {dataset} needs a data_dir"
            raise DataUnavailableError(msg)
        files = _local_files(Path(data_dir) / dataset, split, spec=spec, where="mirror")
        origin = f"mirror {Path(data_dir) / dataset}"
    elif source == "hub":
        files = _hub_files(spec, split)
        origin = f"hub {spec.repo_id}@{spec.revision}"
    else:
        msg = f"unknown data source {source!r}; use auto, hub, mirror or demo"
        raise VersionSpecError(msg)

    hashes = tuple((path.name, _verified_sha256(path, spec)) for path in files)
    frame = _read_parquet(files, dataset=dataset, split=split)
    logger.info("loaded %s:%s, %d rows from %s", dataset, split, frame.height, origin)
    return SplitData(
        dataset=dataset, split=split, frame=frame, source=origin, files=hashes
    )


def _local_files(
    root: Path, split: str, *, spec: DatasetSpec, where: str
) -> list[Path]:
    files = sorted((root / "data").glob(f"{split}-*.parquet"))
    if not files:
        msg = (
            f"no {split} files for {spec.name} in the {where} at {root} "
            f"(expected {root}/data/{split}-*.parquet). Make a mirror with: "
            f"{mirror_command(spec, root.parent)}"
        )
        raise DataUnavailableError(msg)
    return files


def _hub_files(spec: DatasetSpec, split: str) -> list[Path]:
    # Resolve through the hub client's cache; reading locally avoids `datasets`' own
    # hub resolution, which fails offline even when the cache is warm (FACTS.md).
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(
            spec.repo_id,
            repo_type="dataset",
            revision=spec.revision,
            allow_patterns=[f"data/{split}-*.parquet"],
        )
    except (
        Exception
    ) as err:  # the hub client raises many types; all mean "not reachable"
        msg = (
            f"cannot load {spec.name} ({spec.repo_id}@{spec.revision[:12]}) from the Hugging "
            f"Face hub or its cache: {type(err).__name__}. Offline, make a local mirror "
            f"with `{mirror_command(spec)}` on a machine with internet, copy <DIR> here, "
            f"and pass --data-dir <DIR> (or set EMBEDCACHE_DATA_DIR)."
        )
        raise DataUnavailableError(msg) from err
    return _local_files(Path(folder), split, spec=spec, where="hub snapshot")


def _verified_sha256(path: Path, spec: DatasetSpec) -> str:
    actual = file_sha256(path)
    expected = spec.sha256.get(f"data/{path.name}")
    if expected is not None and actual != expected:
        msg = (
            f"{path} has sha256 {actual}, but {spec.name}@{spec.revision[:12]} pins "
            f"{expected}. The file is corrupt or from another revision: delete it and "
            f"download again with `{mirror_command(spec)}`."
        )
        raise ChecksumMismatchError(msg)
    return actual


def _read_parquet(files: list[Path], *, dataset: str, split: str) -> pl.DataFrame:
    import polars as pl  # here, so `embedcache versions` stays light

    frames = []
    for path in files:
        part = pl.read_parquet(path)
        missing = {"seq", "label"} - set(part.columns)
        if missing:
            msg = (
                f"{path} lacks column(s) {sorted(missing)}; expected columns seq, label"
            )
            raise InvalidSequenceError(msg)
        frames.append(part.select("seq", "label"))
    raw = pl.concat(frames)
    return validate_rows(raw, dataset=dataset, split=split)


def validate_rows(raw: pl.DataFrame, *, dataset: str, split: str) -> pl.DataFrame:
    """Check labels and alphabet, upper-case sequences, add item ids and hashes.

    ``raw`` has columns ``seq`` and ``label`` in published row order.
    """
    import polars as pl

    frame = raw.with_row_index("row").with_columns(
        pl.format(
            "{}:{}:{}",
            pl.lit(dataset),
            pl.lit(split),
            pl.col("row").cast(pl.String).str.zfill(6),
        ).alias("item_id"),
        pl.col("seq").str.to_uppercase(),
    )
    bad_label = frame.filter(~pl.col("label").is_in([0, 1]) | pl.col("label").is_null())
    if bad_label.height:
        first = bad_label.row(0, named=True)
        msg = (
            f"{first['item_id']}: label {first['label']!r} is not 0 or 1 "
            f"({bad_label.height} row(s) affected; first shown)"
        )
        raise InvalidLabelError(msg)
    bad_seq = frame.filter(
        pl.col("seq").is_null() | ~pl.col("seq").str.contains(_VALID_SEQUENCE)
    )
    if bad_seq.height:
        first = bad_seq.row(0, named=True)
        raise InvalidSequenceError(
            describe_bad_sequence(first["item_id"], first["seq"])
            + f" ({bad_seq.height} row(s) affected; first shown)"
        )
    return frame.select(
        "item_id",
        pl.lit(dataset).alias("dataset"),
        pl.lit(split).alias("split"),
        pl.col("row").cast(pl.Int64),
        "seq",
        pl.col("label").cast(pl.Int8),
        pl.col("seq")
        .map_elements(sequence_key, return_dtype=pl.String)
        .alias("seq_sha256"),
    )


def describe_bad_sequence(name: str, seq: str | None) -> str:
    """Say what is wrong with a sequence that failed the A/C/G/T/N check."""
    if not seq:
        return f"{name}: sequence is empty"
    for position, char in enumerate(seq.upper(), start=1):
        if char not in "ACGTN":
            return f"{name}: character {char!r} at position {position} is not one of A, C, G, T, N"
    return f"{name}: sequence is not valid DNA"
