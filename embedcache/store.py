"""Content-addressed embedding store: Zarr v3, per-writer shards, atomic commit records.

Layout (``schema_version`` 1)::

    ROOT/zarr.json                       group; attrs["embedcache"]: kind, schema_version
    ROOT/<key digest>/zarr.json          group per model key; attrs["embedcache"]:
                                         schema_version, dim, dtype, key_json, version
    ROOT/<key digest>/shards/<writer>~<host>~<pid>~<n>/
                                         one zarr group per commit, owned by one writer
        vectors/                         (n, dim) float32, ~2 MiB row chunks, crc32c
        hashes/                          (n, 32) uint8: raw sha256 of each row's sequence
    ROOT/<key digest>/commits/<shard>.json
                                         commit record: sizes + sha256 of every shard
                                         file; a shard exists for readers iff this does

A writer fills its own shard directory completely, fsyncs it, then publishes it with
one atomic ``os.replace`` of the commit record. Committed shards are never modified.
Readers see only committed shards; a hash stored by several shards resolves to the
shard committed first. ``compact`` writes one merged shard that supersedes the old
ones, commits it, and only then retires them.

Leftovers (a killed writer's uncommitted shard or temp file, superseded shards not
yet removed) are *garbage*, not faults: readers never look at them, ``verify``
ignores them, ``garbage()`` lists them and ``compact`` removes those whose writer is
provably dead (same host, pid gone) or that are older than a day.
"""

from __future__ import annotations

import binascii
import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import google_crc32c
import numpy as np

from embedcache.errors import (
    CorruptStoreError,
    DimensionMismatchError,
    InvalidHashError,
    InvalidVectorError,
    StoreError,
)
from embedcache.specs import ModelKey

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
STORE_KIND = "embedcache-store"
KEY_KIND = "embedcache-key"
SHARD_KIND = "embedcache-shard"
COMMIT_FORMAT = "embedcache-commit"

# ~2 MiB chunks: 1024 rows at dim 512; read fastest in benchmarks/store_bench.py
_CHUNK_BYTES = 1 << 21
_HASH_WIDTH = 32
# a writer merges its own shards once this many pile up at one level, so a long
# embedding run that commits every batch still leaves few shards to open
AUTO_MERGE = 16
# uncommitted leftovers whose owner cannot be proven dead are kept this long
GARBAGE_GRACE_S = 24 * 3600.0
_RETRIES = 5
_META_FILES = ("zarr.json", "vectors/zarr.json", "hashes/zarr.json")

_HASH_RE = re.compile(r"[0-9a-f]{64}")
_WRITER_RE = re.compile(r"[A-Za-z0-9_.-]{1,80}")
_HOST = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())[:40] or "host"


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """One model key in the store, as ``keys()`` and ``embedcache store ls`` show it."""

    key: ModelKey
    digest: str
    n_vectors: int  # distinct hashes in the logical view
    dim: int
    n_shards: int  # committed, visible shards
    nbytes: int  # bytes on disk of the visible shards


@dataclass(frozen=True, slots=True)
class Fault:
    """Something ``verify`` found wrong: the file or directory and the problem."""

    path: Path
    problem: str

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}"


@dataclass(frozen=True, slots=True)
class _Commit:
    shard: str
    path: Path
    order_ns: int
    n_rows: int
    files: dict[str, tuple[int, str]]  # relative path -> (size, sha256)
    supersedes: tuple[str, ...]
    writer: str


@dataclass(slots=True)
class _Shard:
    commit: _Commit
    path: Path
    keys: np.ndarray  # (n,) S32: raw sha256 of each row's sequence
    chunk_rows: int
    dim: int


@dataclass(slots=True)
class _KeyState:
    key: ModelKey
    digest: str
    dim: int
    path: Path
    listing: frozenset[str] | None = None
    commits: dict[str, _Commit] = field(default_factory=dict)
    loaded: dict[str, _Shard] = field(default_factory=dict)
    order: list[_Shard] = field(default_factory=list)
    hidden: dict[str, str] = field(default_factory=dict)  # superseded id -> superseder
    # the logical view: distinct hashes sorted, the global row serving each, and
    # their first 8 bytes as integers for a fast search (None if two collide)
    sorted_keys: np.ndarray = field(default_factory=lambda: np.empty(0, "S32"))
    sorted_gids: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    prefixes: np.ndarray | None = None
    offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))

    @property
    def commits_dir(self) -> Path:
        return self.path / "commits"

    @property
    def shards_dir(self) -> Path:
        return self.path / "shards"


class _ShardRetiredError(Exception):
    """A shard vanished because another process retired it; refresh and retry."""


# --- small file helpers -----------------------------------------------------------


def _version() -> str:
    from embedcache import __version__

    return __version__


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _names(path: Path) -> list[str]:
    """Entry names of a directory; none if it does not exist (yet)."""
    try:
        return [p.name for p in path.iterdir()]
    except FileNotFoundError:
        return []


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sha256_file(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _json_bytes(obj: object) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8")


def _write_tmp(path: Path, data: bytes) -> Path:
    # host and pid in the name let garbage collection tell a dead writer's file
    tmp = path.with_name(
        f".{path.name}~{_HOST}~{os.getpid()}~{secrets.token_hex(4)}.tmp"
    )
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return tmp


def _create_exclusive(path: Path, data: bytes) -> bool:
    """Create ``path`` atomically unless it exists (never clobbers); True if created."""
    tmp = _write_tmp(path, data)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        tmp.unlink()
    _fsync_dir(path.parent)
    return True


def _replace_atomic(path: Path, data: bytes) -> None:
    """Write tmp, fsync, ``os.replace``, fsync the directory: all or nothing."""
    tmp = _write_tmp(path, data)
    try:
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _group_meta(attrs: dict[str, Any]) -> bytes:
    return _json_bytes(
        {"zarr_format": 3, "node_type": "group", "attributes": {"embedcache": attrs}}
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        msg = f"{path} is not valid JSON ({err}); the store is damaged there"
        raise CorruptStoreError(msg) from err
    if not isinstance(data, dict):
        msg = f"{path} holds {type(data).__name__}, expected a JSON object"
        raise CorruptStoreError(msg)
    return data


def _embedcache_attrs(path: Path, *, kind: str) -> dict[str, Any]:
    """Read and check the embedcache attrs of a group's zarr.json."""
    meta = _read_json(path)
    attrs = meta.get("attributes", {}).get("embedcache")
    if not isinstance(attrs, dict) or attrs.get("kind") != kind:
        msg = (
            f"{path} is not an embedcache {kind} (attrs['embedcache']['kind'] is "
            f"{attrs.get('kind') if isinstance(attrs, dict) else None!r}). Point --store "
            "at an embedcache store or at a new, empty directory."
        )
        raise StoreError(msg)
    version = attrs.get("schema_version")
    if version != SCHEMA_VERSION:
        msg = (
            f"{path} was written with store schema_version {version!r} by embedcache "
            f"{attrs.get('embedcache_version', '?')}; this embedcache {_version()} reads "
            f"schema_version {SCHEMA_VERSION} only. Open it with a matching embedcache, "
            "or use a new store directory (never mix the two)."
        )
        raise StoreError(msg)
    return attrs


def _check_hashes(hashes: Sequence[str]) -> np.ndarray:
    """Validate sequence hashes at the boundary; return them as raw (n,) S32 keys."""
    hs = hashes if isinstance(hashes, list) else list(hashes)
    if not hs:
        return np.empty(0, "S32")
    try:
        raw = "".join(hs).encode("ascii")
    except (TypeError, UnicodeEncodeError):
        raw = b""
    # vectorised check (41k hashes in a few ms): only [0-9a-f], 64 per hash
    if (
        len(raw) == 64 * len(hs)
        and not raw.translate(None, b"0123456789abcdef")
        and set(map(len, hs)) == {64}
    ):
        return np.frombuffer(binascii.unhexlify(raw), "S32")
    for i, h in enumerate(hs):
        if not isinstance(h, str) or not _HASH_RE.fullmatch(h):
            msg = (
                f"hash #{i} {h!r} is not a sequence key (64 lowercase hex characters); "
                "compute it with embedcache.hashing.sequence_key(seq)"
            )
            raise InvalidHashError(msg)
    raise AssertionError  # unreachable: the fast check failed, so one item is bad


def _prefixes(keys: np.ndarray) -> np.ndarray:
    """First 8 bytes of each S32 key as an unsigned integer (order-preserving)."""
    return np.frombuffer(keys.tobytes(), ">u8").reshape(-1, 4)[:, 0].astype(np.uint64)


def _to_hex(keys: np.ndarray) -> list[str]:
    text = keys.tobytes().hex()
    return [text[i : i + 64] for i in range(0, len(text), 64)]


def _check_vectors(key: ModelKey, n: int, vectors: object) -> np.ndarray:
    arr = np.asarray(vectors)
    if arr.ndim != 2 or arr.shape[0] != n or arr.shape[1] == 0:
        msg = (
            f"vectors for {key.short()} (key {key.digest[:12]}) have shape {arr.shape}; "
            f"expected ({n}, dim) with dim >= 1: one row per hash"
        )
        raise DimensionMismatchError(msg)
    if arr.dtype.kind != "f":
        msg = (
            f"vectors for {key.short()} (key {key.digest[:12]}) have dtype {arr.dtype}; "
            "the store keeps float32: pass floating-point vectors"
        )
        raise DimensionMismatchError(msg)
    out = arr.astype(np.float32, copy=False)
    finite = np.isfinite(out).all(axis=1)
    if not finite.all():
        row = int(np.flatnonzero(~finite)[0])
        msg = (
            f"vector row {row} for {key.short()} is not finite in float32 "
            "(NaN, inf, or beyond float32 range); nothing was written"
        )
        raise InvalidVectorError(msg)
    return np.ascontiguousarray(out)


def _readinto_full(f: Any, buf: bytearray | memoryview) -> int:  # noqa: ANN401
    """readinto until ``buf`` is full or the file ends; return the bytes read."""
    view = memoryview(buf).cast("B")
    done = 0
    while done < len(view):
        got = f.readinto(view[done:])
        if not got:
            break
        done += got
    return done


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _default_writer_id() -> str:
    return f"{_HOST}-{os.getpid()}-{secrets.token_hex(3)}"


def _chunk_rows(n: int, row_bytes: int) -> int:
    return max(1, min(max(n, 1), _CHUNK_BYTES // row_bytes))


def _check_array_meta(
    meta: dict[str, Any], shape: tuple[int, int], dtype: str
) -> tuple[int, str | None]:
    """Return the chunk rows of an array this schema writes; raise ValueError if not."""
    codecs = meta.get("codecs")
    grid = meta.get("chunk_grid", {})
    chunk_shape = grid.get("configuration", {}).get("chunk_shape")
    keys = meta.get("chunk_key_encoding", {})
    problems = []
    if meta.get("node_type") != "array" or meta.get("zarr_format") != 3:
        problems.append("not a zarr v3 array")
    if list(meta.get("shape", [])) != list(shape):
        problems.append(f"shape {meta.get('shape')} != {list(shape)} in commit record")
    if meta.get("data_type") != dtype:
        problems.append(f"data_type {meta.get('data_type')!r} != {dtype!r}")
    if (
        grid.get("name") != "regular"
        or not isinstance(chunk_shape, list)
        or len(chunk_shape) != 2
        or chunk_shape[1] != shape[1]
        or not isinstance(chunk_shape[0], int)
        or chunk_shape[0] < 1
    ):
        problems.append(f"unexpected chunk grid {grid}")
    if keys.get("name") != "default" or keys.get("configuration", {}).get(
        "separator", "/"
    ) != ("/"):
        problems.append(f"unexpected chunk key encoding {keys}")
    endian = None
    if (
        not isinstance(codecs, list)
        or len(codecs) != 2
        or codecs[0].get("name") != "bytes"
        or codecs[1] != {"name": "crc32c"}
    ):
        problems.append(f"unexpected codecs {codecs} (schema 1 writes bytes + crc32c)")
    else:
        endian = codecs[0].get("configuration", {}).get("endian")
        if endian not in (None, "little"):
            problems.append(f"unexpected byte order {endian!r}")
    if problems:
        raise ValueError("; ".join(problems))
    return int(chunk_shape[0]), endian


def _decode_chunk(data: bytes, n_items: int, dtype: type) -> np.ndarray:
    """Check a bytes+crc32c chunk and view its payload (raises ValueError if bad)."""
    itemsize = np.dtype(dtype).itemsize
    if len(data) != n_items * itemsize + 4:
        msg = f"chunk is {len(data)} bytes, expected {n_items * itemsize + 4}"
        raise ValueError(msg)
    body = np.frombuffer(data, np.uint8, count=len(data) - 4)
    if google_crc32c.value(body) != int.from_bytes(data[-4:], "little"):
        msg = "crc32c of the chunk does not match its stored checksum"
        raise ValueError(msg)
    return np.frombuffer(data, dtype, count=n_items)


# --- the store ----------------------------------------------------------------------


class EmbeddingStore:
    """A directory of embeddings keyed by model key and sequence hash.

    Parameters
    ----------
    root
        The store directory; created (with its root group) if missing and ``create``.
    writer_id
        Names this writer's shards; default ``<host>-<pid>-<random>``, unique per
        instance. Two live writers must never share one.
    create
        Whether a missing or empty directory becomes a new store; otherwise opening it
        raises StoreError.
    auto_merge
        Merge this writer's own shards once this many accumulate at one size level
        (0 turns it off).

    Raises
    ------
    StoreError
        The directory is not an embedcache store, or was written with another schema.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        writer_id: str | None = None,
        create: bool = True,
        auto_merge: int = AUTO_MERGE,
    ) -> None:
        self.root = Path(root)
        writer_id = writer_id if writer_id is not None else _default_writer_id()
        if not _WRITER_RE.fullmatch(writer_id):
            msg = (
                f"writer_id {writer_id!r} must be 1-80 characters of letters, digits, "
                "'_', '.', '-'"
            )
            raise ValueError(msg)
        self.writer_id = writer_id
        self._auto_merge = auto_merge
        self._host = _HOST
        self._lock = threading.RLock()
        self._states: dict[str, _KeyState] = {}
        self._own: dict[str, list[tuple[int, str]]] = {}
        self._counter = 0
        self._writing: set[Path] = set()
        self._open_root(create=create)

    def __repr__(self) -> str:
        return f"EmbeddingStore({str(self.root)!r}, writer_id={self.writer_id!r})"

    # --- public API -----------------------------------------------------------------

    def get(
        self, key: ModelKey, hashes: Sequence[str]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Vectors for ``hashes`` in the requested order, and which were found.

        Returns
        -------
        vectors
            float32 (n, dim); rows of missing hashes are NaN. A key absent from the
            store gives shape (n, 0).
        found
            bool (n,).

        Raises
        ------
        CorruptStoreError
            A shard of this key fails its size, sha256 (metadata, hashes) or crc32c
            (vector chunks read) check; no data is returned.
        """
        q = _check_hashes(hashes)
        with self._lock:
            for _ in range(_RETRIES):
                state = self._state(key)
                if state is None:
                    return np.empty((len(q), 0), np.float32), np.zeros(len(q), bool)
                gids = self._lookup(state, q)
                found = gids >= 0
                out = np.empty((len(q), state.dim), np.float32)
                out[~found] = np.nan
                try:
                    self._read_rows(state, gids[found], out, np.flatnonzero(found))
                except _ShardRetiredError:
                    state.listing = None
                    continue
                return out, found
        raise self._retries_exhausted(key)

    def contains(self, key: ModelKey, hashes: Sequence[str]) -> np.ndarray:
        """Which hashes have a stored vector (bool (n,)), without reading vectors."""
        q = _check_hashes(hashes)
        with self._lock:
            state = self._state(key)
            if state is None:
                return np.zeros(len(q), bool)
            return self._lookup(state, q) >= 0

    def put(self, key: ModelKey, hashes: Sequence[str], vectors: np.ndarray) -> int:
        """Store vectors not stored yet, as one atomic commit; return how many.

        Idempotent: hashes already stored (or repeated within the call) are skipped,
        their new vectors ignored (the first committed vector wins).

        Raises
        ------
        DimensionMismatchError
            ``vectors`` is not (len(hashes), dim) floating point, or dim disagrees
            with the key's group. Nothing is written.
        InvalidVectorError
            A vector is not finite in float32. Nothing is written.
        """
        q = _check_hashes(hashes)
        vecs = _check_vectors(key, len(q), vectors)
        if not len(q):
            return 0
        with self._lock:
            state = self._state(key, create_dim=vecs.shape[1])
            assert state is not None  # created above when absent
            if state.dim != vecs.shape[1]:
                msg = (
                    f"vectors of dim {vecs.shape[1]} for {key.short()} (key "
                    f"{state.digest[:12]}), but {state.path} holds dim {state.dim}. "
                    "Nothing was written. Vectors of another dim belong to another "
                    "model key (check layer, rc_mode and adapter options)."
                )
                raise DimensionMismatchError(msg)
            # first occurrence of each hash not stored yet, in the caller's order
            _, first = np.unique(q, return_index=True)
            rows = np.sort(first)
            rows = rows[self._lookup(state, q[rows]) < 0]
            if not len(rows):
                return 0
            new = vecs[rows]
            shard = self._write_shard(
                state, q[rows], lambda arr: arr.__setitem__(..., new)
            )
            logger.debug(
                "committed %d rows for %s as %s", len(rows), key.short(), shard
            )
            self._refresh(state)
            self._maybe_merge_own(state, shard)
            return len(rows)

    def hashes(self, key: ModelKey) -> list[str]:
        """Every hash stored for ``key`` (sorted), e.g. to export the whole key."""
        with self._lock:
            state = self._state(key)
            return [] if state is None else _to_hex(state.sorted_keys)

    def keys(self) -> list[KeyInfo]:
        """Every model key in the store with its counts and size, by digest."""
        out = []
        with self._lock:
            for digest in self._key_dirs():
                key = self._read_key(self.root / digest)
                state = self._state(key)
                if state is None:  # retired between listing and reading
                    continue
                nbytes = sum(
                    size
                    for shard in state.order
                    for size, _ in shard.commit.files.values()
                )
                out.append(
                    KeyInfo(
                        key=key,
                        digest=digest,
                        n_vectors=len(state.sorted_keys),
                        dim=state.dim,
                        n_shards=len(state.order),
                        nbytes=nbytes,
                    )
                )
        return out

    def verify(self) -> list[Fault]:
        """Full check: every committed file's size and sha256, and the metadata.

        Returns the faults found (``[]`` means healthy). Uncommitted leftovers of
        killed writers and superseded shards awaiting removal are *garbage*, not
        faults: readers never look at them; see ``garbage()``.
        """
        faults: list[Fault] = []
        with self._lock:
            root_meta = self.root / "zarr.json"
            try:
                _embedcache_attrs(root_meta, kind=STORE_KIND)
            except (OSError, CorruptStoreError) as err:
                return [Fault(root_meta, str(err))]
            for digest in self._key_dirs():
                faults.extend(self._verify_key(self.root / digest))
        return sorted(faults, key=lambda f: (str(f.path), f.problem))

    def garbage(self) -> list[Path]:
        """Leftovers readers ignore: uncommitted or superseded shards, temp files."""
        with self._lock:
            out: list[Path] = []
            for digest in self._key_dirs():
                out.extend(p for p, _ in self._garbage_in(self.root / digest))
            return sorted(out)

    def compact(self, key: ModelKey | None = None) -> None:
        """Merge each key's shards into one, atomically, dropping duplicate rows.

        The merged shard is committed (superseding the old ones) before any old shard
        is retired, so a crash at any point leaves a readable store with every row.
        Also removes garbage that is provably dead (see ``garbage()``).
        """
        with self._lock:
            if key is None:
                keys = [self._read_key(self.root / d) for d in self._key_dirs()]
            else:
                keys = [key]
            for k in keys:
                state = self._state(k)
                if state is None:
                    continue
                for _ in range(_RETRIES):
                    if len(state.order) <= 1 and not state.hidden:
                        break
                    try:
                        merged = self._merge(
                            state, [s.commit.shard for s in state.order]
                        )
                    except _ShardRetiredError:  # another process compacted meanwhile
                        state.listing = None
                        self._refresh(state)
                        continue
                    logger.info("compacted %s into shard %s", k.short(), merged)
                    self._own.pop(state.digest, None)
                    break
                else:
                    raise self._retries_exhausted(k)
                self._collect_garbage(state)

    # --- opening ----------------------------------------------------------------------

    def _open_root(self, *, create: bool) -> None:
        meta = self.root / "zarr.json"
        if not meta.exists():
            if not create:
                msg = f"no embedcache store at {self.root} (no zarr.json there)"
                raise StoreError(msg)
            self.root.mkdir(parents=True, exist_ok=True)
            if any(not p.name.startswith(".") for p in self.root.iterdir()):
                msg = (
                    f"{self.root} is not empty and is not an embedcache store (no "
                    "zarr.json); choose a new or empty directory for the store"
                )
                raise StoreError(msg)
            attrs = {
                "kind": STORE_KIND,
                "schema_version": SCHEMA_VERSION,
                "embedcache_version": _version(),
            }
            _create_exclusive(meta, _group_meta(attrs))
        _embedcache_attrs(meta, kind=STORE_KIND)

    def _key_dirs(self) -> list[str]:
        return sorted(
            p.name
            for p in self.root.iterdir()
            if not p.name.startswith(".") and (p / "zarr.json").is_file()
        )

    def _read_key(self, path: Path) -> ModelKey:
        attrs = _embedcache_attrs(path / "zarr.json", kind=KEY_KIND)
        try:
            key = ModelKey.from_json(attrs["key_json"])
        except (KeyError, TypeError, ValueError) as err:
            msg = f"{path / 'zarr.json'}: unreadable model key ({err})"
            raise CorruptStoreError(msg) from err
        if key.digest != path.name:
            msg = (
                f"{path / 'zarr.json'} holds a key whose digest is {key.digest}, not its "
                "directory name; the group was renamed or damaged"
            )
            raise CorruptStoreError(msg)
        return key

    def _state(
        self, key: ModelKey, *, create_dim: int | None = None
    ) -> _KeyState | None:
        digest = key.digest
        state = self._states.get(digest)
        if state is None:
            path = self.root / digest
            meta = path / "zarr.json"
            if not meta.is_file():
                if create_dim is None:
                    return None
                self._create_key_group(key, path, create_dim)
            attrs = _embedcache_attrs(meta, kind=KEY_KIND)
            if attrs.get("key_json") != key.canonical_json():
                msg = (
                    f"{meta} records key {attrs.get('key_json')!r}, not "
                    f"{key.canonical_json()!r}; the group is damaged or foreign"
                )
                raise CorruptStoreError(msg)
            if attrs.get("dtype") != "float32" or not isinstance(attrs.get("dim"), int):
                msg = f"{meta}: dtype/dim attrs {attrs.get('dtype')}/{attrs.get('dim')} unreadable"
                raise CorruptStoreError(msg)
            state = _KeyState(key=key, digest=digest, dim=attrs["dim"], path=path)
            self._states[digest] = state
        self._refresh(state)
        return state

    def _create_key_group(self, key: ModelKey, path: Path, dim: int) -> None:
        path.mkdir(exist_ok=True)
        (path / "shards").mkdir(exist_ok=True)
        (path / "commits").mkdir(exist_ok=True)
        attrs = {
            "kind": KEY_KIND,
            "schema_version": SCHEMA_VERSION,
            "dim": dim,
            "dtype": "float32",
            "key_json": key.canonical_json(),
            "embedcache_version": _version(),
        }
        # link-based create: a concurrent writer's group (maybe of another dim) wins
        # and is then checked like any existing group
        if _create_exclusive(path / "zarr.json", _group_meta(attrs)):
            _fsync_dir(self.root)
            logger.info("created group %s for %s (dim %d)", path, key.short(), dim)

    # --- reading commits and shards ---------------------------------------------------

    def _refresh(self, state: _KeyState) -> None:
        """Bring the key's view up to the committed shards on disk."""
        for _ in range(_RETRIES):
            try:
                names = frozenset(
                    n
                    for n in _names(state.commits_dir)
                    if n.endswith(".json") and not n.startswith(".")
                )
            except FileNotFoundError:
                names = frozenset()
            if names == state.listing:
                return
            try:
                self._rebuild(state, names)
            except _ShardRetiredError:
                continue
            return
        raise self._retries_exhausted(state.key)

    def _rebuild(self, state: _KeyState, names: frozenset[str]) -> None:
        commits = {}
        for name in names:
            shard = name[: -len(".json")]
            commit = state.commits.get(shard)
            if commit is None:
                try:
                    commit = self._parse_commit(state, state.commits_dir / name)
                except FileNotFoundError:
                    continue  # retired since listed
            commits[shard] = commit
        hidden = {}
        for commit in sorted(commits.values(), key=lambda c: c.shard):
            for old in commit.supersedes:
                if old in commits:
                    hidden.setdefault(old, commit.shard)
        visible = sorted(
            (c for s, c in commits.items() if s not in hidden),
            key=lambda c: (c.order_ns, c.shard),
        )
        shards = [
            state.loaded.get(c.shard) or self._load_shard(state, c) for c in visible
        ]
        offsets = np.zeros(len(shards) + 1, np.int64)
        offsets[1:] = np.cumsum([len(s.keys) for s in shards])
        keys = (
            np.concatenate([s.keys for s in shards]) if shards else np.empty(0, "S32")
        )
        # stable sort keeps shard (commit) order among equal hashes: first wins
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
        first = np.ones(len(keys), bool)
        first[1:] = keys[1:] != keys[:-1]
        prefixes = _prefixes(keys[first])
        unique_prefixes = not np.any(prefixes[1:] == prefixes[:-1])
        state.sorted_keys = keys[first]
        state.sorted_gids = order[first].astype(np.int64)
        state.prefixes = prefixes if unique_prefixes else None
        state.commits = commits
        state.hidden = hidden
        state.loaded = {s.commit.shard: s for s in shards}
        state.order = shards
        state.offsets = offsets
        state.listing = names
        if len(shards) > 4 * AUTO_MERGE:
            logger.warning(
                "%s has %d shards; run `embedcache store compact --store %s` to speed up opening",
                state.key.short(),
                len(shards),
                self.root,
            )

    def _parse_commit(self, state: _KeyState, path: Path) -> _Commit:
        record = _read_json(path)
        shard = path.name[: -len(".json")]
        try:
            if record["format"] != COMMIT_FORMAT:
                raise ValueError(f"format {record['format']!r}")  # noqa: EM102
            if record["schema_version"] != SCHEMA_VERSION:
                raise ValueError(f"schema_version {record['schema_version']!r}")  # noqa: EM102
            if record["shard"] != shard:
                raise ValueError(f"names shard {record['shard']!r}")  # noqa: EM102
            if record["dim"] != state.dim:
                raise ValueError(f"dim {record['dim']} != group dim {state.dim}")  # noqa: EM102
            files = {
                str(rel): (int(v["size"]), str(v["sha256"]))
                for rel, v in record["files"].items()
            }
            return _Commit(
                shard=shard,
                path=path,
                order_ns=int(record["order_ns"]),
                n_rows=int(record["n_rows"]),
                files=files,
                supersedes=tuple(str(s) for s in record["supersedes"]),
                writer=str(record["writer"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            msg = (
                f"{path}: commit record is malformed ({err}); the shard is not trusted"
            )
            raise CorruptStoreError(msg) from err

    def _corrupt(self, path: Path, problem: str, commit: _Commit) -> CorruptStoreError:
        msg = (
            f"{path}: {problem}. Shard {commit.shard} is not trusted and no data is "
            f"served from it. Run `embedcache store verify --store {self.root}`; to drop "
            f"the shard (its rows will be recomputed) delete its commit record {commit.path}."
        )
        return CorruptStoreError(msg)

    def _missing(self, path: Path, commit: _Commit) -> Exception:
        # _retire renames the shard out of the way before deleting its record
        shards_dir = commit.path.parent.parent / "shards"
        if not commit.path.exists() or any(
            shards_dir.glob(f".retired.{commit.shard}.*")
        ):
            return _ShardRetiredError(commit.shard)
        return self._corrupt(path, "file is missing", commit)

    def _load_shard(self, state: _KeyState, commit: _Commit) -> _Shard:
        """Cheap checks (every size, metadata and hashes sha256), then the hashes."""
        path = state.shards_dir / commit.shard
        for rel, (size, _) in commit.files.items():
            try:
                actual = (path / rel).stat().st_size
            except FileNotFoundError:
                raise self._missing(path / rel, commit) from None
            if actual != size:
                problem = f"size {actual} bytes, commit record says {size} (truncated or rewritten)"
                raise self._corrupt(path / rel, problem, commit)
        metas = {}
        for rel in _META_FILES:
            if rel not in commit.files:
                raise self._corrupt(path, f"commit record lists no {rel}", commit)
            data = self._read_checked(path / rel, commit, rel)
            try:
                metas[rel] = json.loads(data)
            except (UnicodeDecodeError, json.JSONDecodeError) as err:
                raise self._corrupt(path / rel, f"not JSON ({err})", commit) from err
        n = commit.n_rows
        try:
            rows, _ = _check_array_meta(
                metas["vectors/zarr.json"], (n, state.dim), "float32"
            )
            hrows, _ = _check_array_meta(
                metas["hashes/zarr.json"], (n, _HASH_WIDTH), "uint8"
            )
        except ValueError as err:
            raise self._corrupt(path, str(err), commit) from err
        expected = {f"vectors/c/{i}/0" for i in range(-(-n // rows))}
        expected |= {f"hashes/c/{i}/0" for i in range(-(-n // hrows))}
        if not expected <= commit.files.keys():
            missing = min(expected - commit.files.keys())
            raise self._corrupt(
                path / missing, "chunk not in the commit record", commit
            )
        parts = []
        for i in range(-(-n // hrows)):
            rel = f"hashes/c/{i}/0"
            data = self._read_checked(path / rel, commit, rel)
            try:
                parts.append(_decode_chunk(data, hrows * _HASH_WIDTH, np.uint8))
            except ValueError as err:
                raise self._corrupt(path / rel, str(err), commit) from err
        raw = (
            np.concatenate(parts)[: n * _HASH_WIDTH] if parts else np.empty(0, np.uint8)
        )
        keys = np.frombuffer(raw.tobytes(), "S32")
        return _Shard(
            commit=commit, path=path, keys=keys, chunk_rows=rows, dim=state.dim
        )

    def _read_checked(self, path: Path, commit: _Commit, rel: str) -> bytes:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise self._missing(path, commit) from None
        if _sha256(data) != commit.files[rel][1]:
            raise self._corrupt(path, "sha256 differs from the commit record", commit)
        return data

    def _lookup(self, state: _KeyState, q: np.ndarray) -> np.ndarray:
        """Global row of each S32 key in the logical view, -1 where absent."""
        keys = state.sorted_keys
        if not len(keys) or not len(q):
            return np.full(len(q), -1, np.int64)
        # search in sorted query order: ~4x faster than random probes (cache)
        if state.prefixes is not None:  # integer search on the first 8 bytes
            qp = _prefixes(q)
            by = np.argsort(qp)
            pos = np.searchsorted(state.prefixes, qp[by])
        else:  # two stored hashes share 8 bytes: search on the whole hash
            by = np.argsort(q)
            pos = np.searchsorted(keys, q[by])
        pos[pos == len(keys)] = 0
        gids = np.full(len(q), -1, np.int64)
        gids[by] = np.where(keys[pos] == q[by], state.sorted_gids[pos], -1)
        return gids

    def _read_rows(
        self, state: _KeyState, gids: np.ndarray, out: np.ndarray, dest: np.ndarray
    ) -> None:
        """out[dest] = vectors of global rows ``gids``, chunk by chunk."""
        if gids.size == 0:
            return
        tasks = []
        which = np.searchsorted(state.offsets, gids, side="right") - 1
        by_shard = np.argsort(which, kind="stable")
        bounds = np.flatnonzero(np.diff(which[by_shard])) + 1
        for part in np.split(by_shard, bounds):
            shard = state.order[int(which[part[0]])]
            rows = gids[part] - state.offsets[int(which[part[0]])]
            chunk = rows // shard.chunk_rows
            by_chunk = np.argsort(chunk, kind="stable")
            cbounds = np.flatnonzero(np.diff(chunk[by_chunk])) + 1
            for sel in np.split(by_chunk, cbounds):
                c = int(chunk[sel[0]])
                tasks.append(
                    (shard, c, rows[sel] - c * shard.chunk_rows, dest[part[sel]])
                )

        def run(task: tuple[_Shard, int, np.ndarray, np.ndarray]) -> None:
            shard, c, src, dst = task
            k = len(src)
            if (
                src[-1] - src[0] == k - 1
                and dst[-1] - dst[0] == k - 1
                and np.all(np.diff(src) == 1)
                and np.all(np.diff(dst) == 1)
            ):
                # rows in stored order: read straight into the output (one copy)
                d0 = int(dst[0])
                self._read_chunk_into(shard, c, int(src[0]), out[d0 : d0 + k])
            else:
                out[dst] = self._read_chunk(shard, c)[src]

        if len(tasks) < 4:
            for task in tasks:
                run(task)
            return
        # file reads and crc32c release the GIL: two threads overlap them
        with ThreadPoolExecutor(max_workers=2) as pool:
            list(pool.map(run, tasks))

    def _chunk_path(self, shard: _Shard, c: int) -> Path:
        return shard.path / f"vectors/c/{c}/0"

    def _read_chunk(self, shard: _Shard, c: int) -> np.ndarray:
        path = self._chunk_path(shard, c)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise self._missing(path, shard.commit) from None
        try:
            flat = _decode_chunk(data, shard.chunk_rows * shard.dim, np.float32)
        except ValueError as err:
            raise self._corrupt(path, str(err), shard.commit) from err
        return flat.reshape(shard.chunk_rows, shard.dim)

    def _read_chunk_into(
        self, shard: _Shard, c: int, start: int, dst: np.ndarray
    ) -> None:
        """Rows start.. of chunk c into ``dst``, checking the whole chunk's crc32c."""
        path = self._chunk_path(shard, c)
        row_bytes = 4 * shard.dim
        size = shard.chunk_rows * row_bytes + 4
        head = bytearray(start * row_bytes)
        tail = bytearray(size - len(head) - dst.nbytes)
        try:
            with path.open("rb", buffering=0) as f:
                got = sum(
                    _readinto_full(f, b)
                    for b in (head, memoryview(dst).cast("B"), tail)
                )
                extra = f.read(1)
        except FileNotFoundError:
            raise self._missing(path, shard.commit) from None
        if got != size or extra:
            problem = f"chunk is not {size} bytes (truncated or rewritten)"
            raise self._corrupt(path, problem, shard.commit)
        crc = google_crc32c.extend(0, bytes(head)) if head else 0
        crc = google_crc32c.extend(crc, dst.reshape(-1).view(np.uint8))
        crc = google_crc32c.extend(crc, bytes(tail[:-4]))
        if crc != int.from_bytes(tail[-4:], "little"):
            problem = "crc32c of the chunk does not match its stored checksum"
            raise self._corrupt(path, problem, shard.commit)

    def _retries_exhausted(self, key: ModelKey) -> StoreError:
        msg = (
            f"shards of {key.short()} kept vanishing while reading {self.root}: another "
            "process is compacting it; retry when it is done"
        )
        return StoreError(msg)

    # --- writing ----------------------------------------------------------------------

    def _new_shard_dir(self, state: _KeyState) -> Path:
        state.shards_dir.mkdir(parents=True, exist_ok=True)
        while True:
            self._counter += 1
            # host and pid in the name: a killed writer's leftover is recognisable
            # as dead even if it died before writing anything inside
            name = f"{self.writer_id}~{self._host}~{os.getpid()}~{self._counter:06d}"
            path = state.shards_dir / name
            try:
                path.mkdir()  # exclusive: no two writers ever share a shard
            except FileExistsError:
                continue
            return path

    def _write_shard(
        self,
        state: _KeyState,
        keys: np.ndarray,
        fill: Callable[[Any], None],
        *,
        supersedes: Iterable[str] = (),
        order_ns: int | None = None,
    ) -> str:
        """Write a complete shard, fsync it, then publish it with its commit record."""
        import zarr
        from zarr.codecs import Crc32cCodec

        n, dim = len(keys), state.dim
        path = self._new_shard_dir(state)
        shard = path.name
        record_path = state.commits_dir / f"{shard}.json"
        self._writing.add(path)
        try:
            owner = {
                "kind": SHARD_KIND,
                "writer": self.writer_id,
                "host": self._host,
                "pid": os.getpid(),
                "created_ns": time.time_ns(),
            }
            group = zarr.open_group(
                store=str(path),
                mode="w-",
                zarr_format=3,
                attributes={"embedcache": owner},
            )
            config = {
                "write_empty_chunks": True
            }  # every chunk exists, so every one is checked
            vectors = group.create_array(
                "vectors",
                shape=(n, dim),
                dtype="float32",
                chunks=(_chunk_rows(n, 4 * dim), dim),
                filters=None,
                compressors=[Crc32cCodec()],
                fill_value=np.nan,
                config=config,
            )
            fill(vectors)
            hashes = group.create_array(
                "hashes",
                shape=(n, _HASH_WIDTH),
                dtype="uint8",
                chunks=(_chunk_rows(n, _HASH_WIDTH), _HASH_WIDTH),
                filters=None,
                compressors=[Crc32cCodec()],
                config=config,
            )
            raw = np.ascontiguousarray(keys, "S32").tobytes()
            hashes[...] = np.frombuffer(raw, np.uint8).reshape(n, _HASH_WIDTH)
            files = self._seal(path)
            record = {
                "format": COMMIT_FORMAT,
                "schema_version": SCHEMA_VERSION,
                "shard": shard,
                "writer": self.writer_id,
                "n_rows": n,
                "dim": dim,
                "committed_ns": time.time_ns(),
                "supersedes": sorted(supersedes),
                "files": {
                    rel: {"size": s, "sha256": d} for rel, (s, d) in files.items()
                },
                "embedcache_version": _version(),
            }
            record["order_ns"] = (
                record["committed_ns"] if order_ns is None else order_ns
            )
            state.commits_dir.mkdir(exist_ok=True)
            _replace_atomic(record_path, _json_bytes(record))
        except BaseException:
            if not record_path.exists():  # never committed: nobody reads it, drop it
                shutil.rmtree(path, ignore_errors=True)
            raise
        finally:
            self._writing.discard(path)
        return shard

    @staticmethod
    def _seal(path: Path) -> dict[str, tuple[int, str]]:
        """fsync every file and directory of a shard; return each file's size, sha256."""
        files: list[Path] = []
        dirs = [path.parent]
        for dirpath, _, names in os.walk(path):
            dirs.append(Path(dirpath))
            files.extend(Path(dirpath) / name for name in names)

        def seal_file(file: Path) -> tuple[int, str]:
            with file.open("rb") as f:
                os.fsync(f.fileno())
                digest = hashlib.file_digest(f, "sha256").hexdigest()
                return f.tell(), digest

        # fsyncs in parallel: the journal commits them together (measured 3-10x
        # faster than one after another for the ~15 entries of a small shard)
        with ThreadPoolExecutor(max_workers=8) as pool:
            sealed = list(pool.map(seal_file, files))
            list(pool.map(_fsync_dir, dirs))
        return dict(
            sorted(
                (f.relative_to(path).as_posix(), v)
                for f, v in zip(files, sealed, strict=True)
            )
        )

    def _merge(self, state: _KeyState, shard_ids: list[str]) -> str:
        """Commit one shard holding the winning rows of ``shard_ids``; retire them."""
        self._refresh(state)
        chosen = set(shard_ids) & {s.commit.shard for s in state.order}
        # hidden shards superseded by a chosen one go too, or they would reappear
        # once their superseder is retired
        grew = True
        while grew:
            extra = {h for h, sup in state.hidden.items() if sup in chosen} - chosen
            chosen |= extra
            grew = bool(extra)
        positions = [i for i, s in enumerate(state.order) if s.commit.shard in chosen]
        winners = np.sort(state.sorted_gids)
        which = np.searchsorted(state.offsets, winners, side="right") - 1
        gids = winners[np.isin(which, positions)]
        keys = np.concatenate([s.keys for s in state.order])[gids]
        orders = [state.commits[s].order_ns for s in chosen]
        block = max(1, 16 * _chunk_rows(len(gids), 4 * state.dim))

        def fill(arr: Any) -> None:  # noqa: ANN401 (a zarr array)
            for start in range(0, len(gids), block):
                part = gids[start : start + block]
                buf = np.empty((len(part), state.dim), np.float32)
                self._read_rows(state, part, buf, np.arange(len(part)))
                arr[start : start + len(part)] = buf

        merged = self._write_shard(
            state, keys, fill, supersedes=chosen, order_ns=min(orders)
        )
        self._retire(state, sorted(chosen))
        self._refresh(state)
        return merged

    def _retire(self, state: _KeyState, shard_ids: list[str]) -> None:
        """Remove superseded shards: dir out of the way, then record, then files."""
        retired = []
        for shard in shard_ids:
            src = state.shards_dir / shard
            dst = state.shards_dir / f".retired.{shard}.{secrets.token_hex(3)}"
            with contextlib.suppress(FileNotFoundError):
                src.rename(dst)
                retired.append(dst)
        for shard in shard_ids:
            with contextlib.suppress(FileNotFoundError):
                (state.commits_dir / f"{shard}.json").unlink()
        _fsync_dir(state.commits_dir)
        for path in retired:
            shutil.rmtree(path, ignore_errors=True)

    def _maybe_merge_own(self, state: _KeyState, shard: str) -> None:
        if self._auto_merge < 2:
            return
        own = self._own.setdefault(state.digest, [])
        own.append((0, shard))
        level = 0
        while True:
            at = [s for lv, s in own if lv == level]
            if len(at) < self._auto_merge:
                return
            own[:] = [(lv, s) for lv, s in own if lv != level]
            live = [s for s in at if s in state.loaded]
            if len(live) < 2:
                return
            try:
                merged = self._merge(state, live)
            except (CorruptStoreError, StoreError, _ShardRetiredError) as err:
                logger.warning(
                    "could not merge shards of %s: %s", state.key.short(), err
                )
                return
            own.append((level + 1, merged))
            level += 1

    # --- verify and garbage -----------------------------------------------------------

    def _verify_key(self, path: Path) -> list[Fault]:
        try:
            key = self._read_key(path)
            state = _KeyState(
                key=key,
                digest=path.name,
                dim=_embedcache_attrs(path / "zarr.json", kind=KEY_KIND)["dim"],
                path=path,
            )
        except (StoreError, CorruptStoreError) as err:
            return [Fault(path / "zarr.json", str(err))]
        faults = []
        commits = {}
        names = sorted(
            n
            for n in (_names(state.commits_dir))
            if n.endswith(".json") and not n.startswith(".")
        )
        for name in names:
            try:
                commit = self._parse_commit(state, state.commits_dir / name)
            except FileNotFoundError:
                continue  # retired by a concurrent compaction
            except CorruptStoreError as err:
                faults.append(Fault(state.commits_dir / name, str(err)))
                continue
            commits[commit.shard] = commit
        hidden = {old for c in commits.values() for old in c.supersedes}
        for shard, commit in sorted(commits.items()):
            if shard in hidden:
                continue
            found = self._verify_shard(state, commit)
            if found and not commit.path.exists():
                continue  # retired while we read it: not a fault
            faults.extend(found)
        return faults

    def _verify_shard(self, state: _KeyState, commit: _Commit) -> list[Fault]:
        path = state.shards_dir / commit.shard
        faults = []
        for rel, (size, digest) in commit.files.items():
            file = path / rel
            if not file.is_file():
                faults.append(Fault(file, f"missing (listed in {commit.path.name})"))
                continue
            actual = file.stat().st_size
            if actual != size:
                problem = f"size {actual} bytes, commit record says {size} (truncated?)"
                faults.append(Fault(file, problem))
            elif _sha256_file(file) != digest:
                faults.append(Fault(file, "sha256 differs from the commit record"))
        if path.is_dir():
            for file in sorted(path.rglob("*")):
                if (
                    file.is_file()
                    and file.relative_to(path).as_posix() not in commit.files
                ):
                    faults.append(Fault(file, "file not in the shard's commit record"))
        if not faults:
            try:
                self._load_shard(state, commit)
            except CorruptStoreError as err:
                faults.append(Fault(path, str(err)))
        return faults

    def _garbage_in(self, key_path: Path) -> list[tuple[Path, bool]]:
        """(path, removable now) of every leftover under one key group."""
        commits_dir, shards_dir = key_path / "commits", key_path / "shards"
        committed: set[str] = set()
        superseded: set[str] = set()
        if commits_dir.is_dir():
            for name in _names(commits_dir):
                if name.endswith(".json") and not name.startswith("."):
                    committed.add(name[: -len(".json")])
                    with contextlib.suppress(OSError, CorruptStoreError, TypeError):
                        record = _read_json(commits_dir / name)
                        superseded.update(map(str, record.get("supersedes", [])))
        out = []
        if shards_dir.is_dir():
            for entry in sorted(shards_dir.iterdir()):
                retired = entry.name.startswith(".retired.")
                if retired or (entry.name in superseded and entry.name in committed):
                    out.append((entry, True))
                elif entry.name not in committed:
                    out.append((entry, self._dead(entry)))
        if commits_dir.is_dir():
            for entry in sorted(commits_dir.iterdir()):
                if entry.name.startswith("."):
                    out.append((entry, self._dead_tmp(entry)))
                elif entry.name[: -len(".json")] in superseded:
                    out.append((entry, True))
        return out

    def _dead_tmp(self, path: Path) -> bool:
        """Whether a temp file's writer is provably gone (or the file is stale)."""
        parts = path.name.rsplit("~", 3)  # .<target>~<host>~<pid>~<random>.tmp
        if len(parts) == 4 and parts[1] == _HOST and parts[2].isdigit():
            pid = int(parts[2])
            if pid != os.getpid() and not _pid_alive(pid):
                return True
        return self._old(path)

    def _old(self, path: Path) -> bool:
        try:
            return time.time() - path.lstat().st_mtime > GARBAGE_GRACE_S
        except FileNotFoundError:
            return False

    def _dead(self, shard_dir: Path) -> bool:
        """Whether an uncommitted shard's writer is provably gone (or it is stale)."""
        if shard_dir in self._writing:
            return False
        parts = shard_dir.name.split("~")
        if len(parts) == 4 and parts[1] == self._host and parts[2].isdigit():
            pid = int(parts[2])
            if pid != os.getpid():
                return not _pid_alive(pid)
        return self._old(shard_dir)

    def _collect_garbage(self, state: _KeyState) -> None:
        removable = [p for p, ok in self._garbage_in(state.path) if ok]
        superseded = [
            p.name
            for p in removable
            if p.parent == state.shards_dir and not p.name.startswith(".")
        ]
        if superseded:
            self._retire(state, superseded)
        for path in removable:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        if removable:
            logger.info(
                "removed %d garbage entries under %s", len(removable), state.path
            )
        state.listing = None
        self._refresh(state)
