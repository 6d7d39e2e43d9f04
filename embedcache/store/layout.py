"""The store's format (``schema_version`` 5): object names, group documents, records.

Every folder is a Zarr v3 group with its ``zarr.json``::

    zarr.json                              attrs.embedcache: kind, schema_version
    <digest>/zarr.json                     one group per model key: dim, key_json, ...
    <digest>/shards/zarr.json              group of the key's runs
    <digest>/shards/<run>/zarr.json        one group per run, written once
    <digest>/shards/<run>/vectors          (n, dim) float32 array, crc32c per chunk
    <digest>/shards/<run>/hashes           (n, 32) uint8 array: raw sha256 per row
    <digest>/shards/<run>/sorted_hashes    (n, 32) uint8: the hashes sorted, one
                                           chunk per block of 1,024 rows
    <digest>/shards/<run>/sorted_rows      (n,) uint32: stored row of each sorted hash
    <digest>/shards/<run>/fences           (blocks, 32) uint8: first hash of each block
    <digest>/shards/<run>/bloom            (words,) uint64: split-block Bloom filter
    <digest>/commits/<run>/zarr.json       the run's claim, put-if-absent: its commit
                                           record (the writer won) or a tombstone (a
                                           collector won: the run never commits)
    <digest>/log/<seq>/zarr.json           the run's publication, put-if-absent at the
                                           first free seq: its record with ``seq``;
                                           readers list the log, and its order is the
                                           key's order (first published wins)
    leases/zarr.json                       group of the writers' leases
    leases/<session>/zarr.json             a live writer's lease (a group, in its
                                           attrs: writer, a renewal counter)

A writer session is ``<writer_id>~<random>`` and names its runs
``<session>~<random>``. The protocol (who writes what, the states of a run, the
invariants) is ``docs/store-protocol.md``. Readers, ``verify`` and Zarr clients
ignore ``leases/``.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import socket
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable

from embedcache.errors import CorruptStoreError, StoreError
from embedcache.specs import ModelKey

SCHEMA_VERSION = 5
STORE_KIND = "embedcache-store"
KEY_KIND = "embedcache-key"
# The code says "run"; these on-disk names still say "shard": schema 5 is shipped
# and readers outside embedcache depend on them (docs/store/reading.md), so
# renaming them would need a migration of every object.
RUNS_FOLDER = "shards"  # <digest>/shards/<run>/...
RUN_ATTR = "shard"  # the record attribute naming its run
RUNS_KIND = "embedcache-shards"  # the kind of <digest>/shards/zarr.json
RUN_KIND = "embedcache-shard"  # the kind of a run's own group
COMMITS_KIND = "embedcache-commits"
COMMIT_KIND = "embedcache-commit"
LOG_KIND = "embedcache-log"
LEASES_KIND = "embedcache-leases"
# where a run's commit record would go: the collector's claim of an uncommitted run
TOMBSTONE_KIND = "embedcache-tombstone"
LEASE_KIND = "embedcache-lease"
LEASES = "leases"
# a lease lives this long after each renewal, renewed this often while its writer
# holds an uncommitted run; the collector waits this margin past its expiry
LEASE_S = 60.0
LEASE_RENEW_S = 20.0
LEASE_MARGIN_S = 300.0
META = "zarr.json"
HASH_WIDTH = 32
# the objects of a run every reader checks against the record's sha256
RUN_META_FILES = (
    "zarr.json",
    "vectors/zarr.json",
    "hashes/zarr.json",
    "sorted_hashes/zarr.json",
    "sorted_rows/zarr.json",
    "fences/zarr.json",
    "bloom/zarr.json",
)

HOST = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())[:40] or "host"
_DIGEST_RE = re.compile(r"[0-9a-f]{64}")


def embedcache_version() -> str:
    from embedcache import __version__

    return __version__


def is_key_digest(name: str) -> bool:
    return bool(_DIGEST_RE.fullmatch(name))


def runs_prefix(digest: str) -> str:
    return f"{digest}/{RUNS_FOLDER}"


def run_prefix(digest: str, run: str) -> str:
    return f"{digest}/{RUNS_FOLDER}/{run}"


def commits_prefix(digest: str) -> str:
    return f"{digest}/commits"


def record_path(digest: str, run: str) -> str:
    return f"{digest}/commits/{run}/{META}"


def log_prefix(digest: str) -> str:
    return f"{digest}/log"


def log_name(seq: int) -> str:
    """A log entry's folder: zero-padded, so a listing sorts by sequence."""
    return f"{seq:012d}"


def log_path(digest: str, seq: int) -> str:
    return f"{digest}/log/{log_name(seq)}/{META}"


def new_session_name(writer_id: str) -> str:
    """``<writer>~<random>``: one writer session, the name of its lease."""
    return f"{writer_id}~{secrets.token_hex(6)}"


def new_run_name(session: str) -> str:
    """``<session>~<random>``: unique, and names the lease of the writer."""
    return f"{session}~{secrets.token_hex(6)}"


def session_of(run: str) -> str | None:
    """The writer session (lease name) of a run; None for an older writer's."""
    parts = run.split("~")
    return "~".join(parts[:2]) if len(parts) == 3 else None


def lease_path(session: str) -> str:
    return f"{LEASES}/{session}/{META}"


def sha256(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def json_bytes(obj: object) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8")


def group_doc(attrs: dict[str, Any]) -> bytes:
    """A Zarr v3 group's ``zarr.json`` with ``attrs`` under ``attributes.embedcache``."""
    return json_bytes(
        {"zarr_format": 3, "node_type": "group", "attributes": {"embedcache": attrs}}
    )


def parse_json(data: bytes, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        msg = f"{where} is not valid JSON ({err}); the store is damaged there"
        raise CorruptStoreError(msg) from err
    if not isinstance(doc, dict):
        msg = f"{where} holds {type(doc).__name__}, expected a JSON object"
        raise CorruptStoreError(msg)
    return doc


def group_attrs(data: bytes, where: str, *, kind: str) -> dict[str, Any]:
    """The embedcache attrs of a group document, checked for kind and schema."""
    attrs = parse_json(data, where).get("attributes", {}).get("embedcache")
    if not isinstance(attrs, dict) or attrs.get("kind") != kind:
        found = attrs.get("kind") if isinstance(attrs, dict) else None
        msg = (
            f"{where} is not an embedcache {kind} (attrs['embedcache']['kind'] is "
            f"{found!r}). Point --store at an embedcache store or at a new, empty "
            "folder or prefix."
        )
        raise StoreError(msg)
    check_schema(attrs, where)
    return attrs


def check_schema(attrs: dict[str, Any], where: str) -> None:
    version = attrs.get("schema_version")
    if version == SCHEMA_VERSION:
        return
    written = attrs.get("embedcache_version", "?")
    if version in (1, 2, 3, 4):
        msg = (
            f"{where} was written with store schema_version {version} by embedcache "
            f"{written}; "
            f"this embedcache {embedcache_version()} reads schema_version "
            f"{SCHEMA_VERSION}. Convert it in place with `embedcache store migrate "
            "--store ...` (nothing is recomputed), or open it with the old embedcache."
        )
    else:
        msg = (
            f"{where} was written with store schema_version {version!r} by embedcache "
            f"{written}; this embedcache {embedcache_version()} reads schema_version "
            f"{SCHEMA_VERSION} only. Open it with a matching embedcache, or use a new "
            "store (never mix the two)."
        )
    raise StoreError(msg)


@dataclass(frozen=True, slots=True)
class CommitRecord:
    """What a commit publishes: a run, its size, and a digest of each of its objects."""

    run: str
    writer: str
    n_rows: int
    dim: int
    order_ns: int  # position among the key's runs: the first stored vector wins
    committed_ns: int
    supersedes: tuple[str, ...]  # runs this one replaces (compaction)
    aliases: tuple[str, ...]  # display names given by the writer (put(..., alias=))
    files: dict[str, tuple[int, str]]  # path in the run -> (size, sha256)
    # runs known to hold none of this one's hashes (the runs a put's look-up
    # read; for a merge, what its runs all lacked and the runs before it): a
    # count of the key's vectors adds such runs' rows without reading them.
    # Empty in records of earlier versions: nothing is known
    lacks: tuple[str, ...] = ()
    # the run's bytes where ``files`` was cut to its metadata (:meth:`for_reading`)
    stored_bytes: int | None = None
    # the key's log entry that published the run (None in the claim at
    # ``commits/<run>``, written before the sequence is won)
    seq: int | None = None
    # where the run sits in the key's order: a merged run takes the place of the
    # earliest run it merged (None: its own seq)
    place: int | None = None
    # 0 for a put's run; a merge of runs of levels <= l is level l + 1: any
    # writer's merge policy reads it here, not in one process's memory
    level: int = 0
    # log seqs of the runs a merge replaced (theirs, and what they replaced): a
    # reader does not probe those gaps for entries a lagging LIST hides
    retires: tuple[tuple[int, int], ...] = ()  # (first, last) ranges

    def replaced(self, seq: int) -> bool:
        """Whether log entry ``seq`` published a run this one replaced."""
        return any(lo <= seq <= hi for lo, hi in self.retires)

    # what computed the run's vectors, each a canonical JSON object (the kernels
    # the machine's tuner chose, its CPU kind, torch's version): one per writer's
    # put, the union for a merge. Empty in records without it (older writers)
    kernels: tuple[str, ...] = ()

    def order(self) -> tuple[int, int]:
        """The run's position among the key's visible runs: first wins."""
        seq = -1 if self.seq is None else self.seq
        return (seq if self.place is None else self.place, seq)

    @classmethod
    def from_log_entry(
        cls, data: bytes, *, seq: int, dim: int, where: str
    ) -> CommitRecord:
        """Parse and check the record published at ``log/<seq>``: it names its run,
        and the seq it was published at; CorruptStoreError if it is malformed."""
        record = cls.from_doc(data, run=None, dim=dim, where=where)
        if record.seq != seq:
            msg = f"{where}: log entry names seq {record.seq}"
            raise CorruptStoreError(msg)
        return record

    def nbytes(self) -> int:
        """The bytes of the run's objects."""
        if self.stored_bytes is not None:
            return self.stored_bytes
        return sum(size for size, _ in self.files.values())

    def for_reading(self) -> CommitRecord:
        """The record as a reader keeps it: of ``files``, the metadata documents, the
        fences and the filter, which it checks as it loads them; not the chunks of
        the arrays (crc32c-checked as read). A record names every object of its
        run (a 12.8 M-row run: ~15,000), and a reader of a 100 M-row key held
        54 MiB of them; ``verify`` reads the records anew."""
        kept = {
            rel: v
            for rel, v in self.files.items()
            if rel.endswith("zarr.json") or rel.startswith(("fences/", "bloom/"))
        }
        return replace(self, files=kept, stored_bytes=self.nbytes())

    def to_doc(self) -> bytes:
        return group_doc(
            {
                "kind": COMMIT_KIND,
                "schema_version": SCHEMA_VERSION,
                RUN_ATTR: self.run,
                "writer": self.writer,
                "n_rows": self.n_rows,
                "dim": self.dim,
                "order_ns": self.order_ns,
                "committed_ns": self.committed_ns,
                "supersedes": sorted(self.supersedes),
                "aliases": sorted(self.aliases),
                "lacks": sorted(self.lacks),
                "files": {
                    rel: {"size": size, "sha256": digest}
                    for rel, (size, digest) in sorted(self.files.items())
                },
                "embedcache_version": embedcache_version(),
                **({} if self.seq is None else {"seq": self.seq}),
                **({} if self.place is None else {"place": self.place}),
                "level": self.level,
                **(
                    {"retires": [list(r) for r in self.retires]} if self.retires else {}
                ),
                **(
                    {"kernels": [json.loads(k) for k in sorted(self.kernels)]}
                    if self.kernels
                    else {}
                ),
            }
        )

    @classmethod
    def from_doc(
        cls, data: bytes, *, run: str | None, dim: int, where: str
    ) -> CommitRecord:
        """Parse and check a record (of run ``run``, if given; a log entry names
        its run); CorruptStoreError if it is malformed."""
        try:
            attrs = group_attrs(data, where, kind=COMMIT_KIND)
            if run is None:
                run = str(attrs[RUN_ATTR])
            if attrs[RUN_ATTR] != run:
                raise ValueError(f"names run {attrs[RUN_ATTR]!r}")  # noqa: EM102
            if attrs["dim"] != dim:
                raise ValueError(f"dim {attrs['dim']} != key dim {dim}")  # noqa: EM102
            return cls(
                run=run,
                writer=str(attrs["writer"]),
                n_rows=int(attrs["n_rows"]),
                dim=int(attrs["dim"]),
                order_ns=int(attrs["order_ns"]),
                committed_ns=int(attrs["committed_ns"]),
                supersedes=tuple(str(s) for s in attrs["supersedes"]),
                aliases=tuple(str(a) for a in attrs.get("aliases", ())),
                lacks=tuple(str(s) for s in attrs.get("lacks", ())),
                seq=None if attrs.get("seq") is None else int(attrs["seq"]),
                place=None if attrs.get("place") is None else int(attrs["place"]),
                level=int(attrs.get("level", 0)),
                retires=tuple(
                    (int(lo), int(hi)) for lo, hi in attrs.get("retires", ())
                ),
                kernels=tuple(
                    json.dumps(k, sort_keys=True) for k in attrs.get("kernels", ())
                ),
                files={
                    str(rel): (int(v["size"]), str(v["sha256"]))
                    for rel, v in attrs["files"].items()
                },
            )
        except (StoreError, KeyError, TypeError, ValueError, AttributeError) as err:
            msg = f"{where}: commit record is malformed ({err}); the run is not trusted"
            raise CorruptStoreError(msg) from err


def seq_ranges(seqs: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """``seqs`` as sorted (first, last) runs of consecutive numbers: a merge's
    ``retires`` stays a few numbers however many commits it covers."""
    ranges: list[tuple[int, int]] = []
    for q in sorted(set(seqs)):
        if ranges and ranges[-1][1] == q - 1:
            ranges[-1] = (ranges[-1][0], q)
        else:
            ranges.append((q, q))
    return tuple(ranges)


def tombstone_doc(run: str, collector: str) -> bytes:
    """The claim a collector puts (if absent) where run ``run``'s record would go,
    before it deletes anything of the run: a late commit of it then fails."""
    return group_doc(
        {
            "kind": TOMBSTONE_KIND,
            "schema_version": SCHEMA_VERSION,
            "run": run,
            "claimed_by": collector,  # for people; no decision reads it
        }
    )


def is_tombstone(data: bytes) -> bool:
    """Whether a document at a record's place is a collector's claim."""
    try:
        attrs = json.loads(data)["attributes"]["embedcache"]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError):
        return False
    return isinstance(attrs, dict) and attrs.get("kind") == TOMBSTONE_KIND


def key_attrs(key: ModelKey, dim: int) -> dict[str, Any]:
    return {
        "kind": KEY_KIND,
        "schema_version": SCHEMA_VERSION,
        "dim": dim,
        "dtype": "float32",
        "key_json": key.canonical_json(),
        "embedcache_version": embedcache_version(),
    }


def parse_key_doc(data: bytes, where: str, digest: str) -> tuple[ModelKey, int]:
    """The model key and dim of a key group; StoreError/CorruptStoreError if bad."""
    attrs = group_attrs(data, where, kind=KEY_KIND)
    try:
        key = ModelKey.from_json(attrs["key_json"])
    except (KeyError, TypeError, ValueError) as err:
        msg = f"{where}: unreadable model key ({err})"
        raise CorruptStoreError(msg) from err
    if key.digest != digest:
        msg = (
            f"{where} holds a key whose digest is {key.digest}, not its folder name; "
            "the group was renamed or damaged"
        )
        raise CorruptStoreError(msg)
    dim = attrs.get("dim")
    if attrs.get("dtype") != "float32" or not isinstance(dim, int) or dim < 1:
        msg = f"{where}: dtype/dim attrs {attrs.get('dtype')}/{dim} unreadable"
        raise CorruptStoreError(msg)
    return key, dim
