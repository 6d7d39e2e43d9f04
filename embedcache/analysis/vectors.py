"""Read a drawn subset's vectors from the store: all present, in order, in chunks.

:class:`VectorStore` is what the analyses need of
:class:`embedcache.store.EmbeddingStore`; a missing vector raises
:class:`~embedcache.errors.MissingEmbeddingsError` naming the command that fills it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import polars as pl

from embedcache.analysis.selection import key_aliases, key_of, select_models
from embedcache.errors import MissingEmbeddingsError

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from embedcache.analysis.probe import ProbeFit
    from embedcache.data.subsets import Subset
    from embedcache.specs import ModelKey

# Test vectors are read in chunks: 25,000 x 4096 (kmer-6) would be 0.4 GB at once.
CHUNK = 4096


class VectorStore(Protocol):
    """What scoring needs from :class:`embedcache.store.EmbeddingStore`."""

    def keys(self) -> Sequence[Any]: ...

    def get(
        self, key: ModelKey, hashes: Sequence[str]
    ) -> tuple[NDArray[np.float32], NDArray[np.bool_]]: ...

    def contains(self, key: ModelKey, hashes: Sequence[str]) -> NDArray[np.bool_]: ...


def check_complete(
    store: VectorStore, key: ModelKey, hashes: Sequence[str], *, version: str
) -> None:
    """Raise MissingEmbeddingsError unless every hash has a vector for ``key``."""
    found = np.asarray(store.contains(key, list(hashes)), dtype=bool)
    _raise_missing(store, key, int((~found).sum()), len(hashes), version=version)


def _raise_missing(
    store: VectorStore, key: ModelKey, n_missing: int, n: int, *, version: str
) -> None:
    if n_missing:
        where = getattr(store, "root", "the store")
        msg = (
            f"{n_missing} of {n} sequences of version {version} have no embedding "
            f"for {key.short()} (key {key.digest[:12]}) in {where}. "
            f"Run `make embeddings MODEL={key.model_id} VERSION={version}` first."
        )
        raise MissingEmbeddingsError(msg)


def load_vectors(
    store: VectorStore,
    key: ModelKey,
    hashes: Sequence[str],
    *,
    version: str,
) -> NDArray[np.float32]:
    """Vectors for ``hashes`` in order; every one must be present.

    Raises
    ------
    MissingEmbeddingsError
        Naming how many are missing, the key and the command that fills them.
    """
    vectors, found = store.get(key, list(hashes))
    _raise_missing(
        store, key, int((~np.asarray(found)).sum()), len(hashes), version=version
    )
    return np.asarray(vectors, dtype=np.float32)


def vector_chunks(
    store: VectorStore,
    key: ModelKey,
    hashes: Sequence[str],
    *,
    version: str,
) -> Iterator[NDArray[np.float32]]:
    """:func:`load_vectors` of ``hashes`` in order, :data:`CHUNK` at a time."""
    for i in range(0, len(hashes), CHUNK):
        yield load_vectors(store, key, hashes[i : i + CHUNK], version=version)


def predict_stored(
    fit: ProbeFit,
    store: VectorStore,
    key: ModelKey,
    hashes: Sequence[str],
    *,
    version: str,
) -> NDArray[np.int64]:
    """A fitted probe's predictions for stored vectors, read chunk by chunk."""
    return np.concatenate(
        [fit.predict(x) for x in vector_chunks(store, key, hashes, version=version)]
        or [np.zeros(0, dtype=np.int64)]
    )


def predict_with_proba(
    fit: ProbeFit,
    store: VectorStore,
    key: ModelKey,
    hashes: Sequence[str],
    *,
    version: str,
) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Like :func:`predict_stored`, with the probability of label 1 beside each label."""
    preds, probas = [np.zeros(0, dtype=np.int64)], [np.zeros(0)]
    for x in vector_chunks(store, key, hashes, version=version):
        preds.append(fit.predict(x))
        probas.append(fit.predict_proba(x))
    return np.concatenate(preds), np.concatenate(probas)


def model_vectors(
    subset: Subset,
    store: VectorStore,
    model: str,
    *,
    split: str = "test",
) -> tuple[dict[str, NDArray[np.float32]], dict[str, NDArray[np.int64]]]:
    """One model's vectors and labels per dataset for the items of one split."""
    infos = store.keys()
    keys = [key_of(info) for info in infos]
    ranked, _, _ = select_models(
        keys, [model], version=subset.version.name, aliases=key_aliases(infos)
    )
    key = ranked[0].key
    vectors: dict[str, NDArray[np.float32]] = {}
    labels: dict[str, NDArray[np.int64]] = {}
    for name in subset.version.dataset_names:
        part = subset.items.filter(
            (pl.col("dataset") == name) & (pl.col("split") == split)
        )
        vectors[name] = load_vectors(
            store, key, part["seq_sha256"].to_list(), version=subset.version.name
        )
        labels[name] = part["label"].to_numpy().astype(np.int64)
    return vectors, labels
