"""Command-line entry points (`embedcache ...`, called by the Makefile).

The only module that prints, reads environment variables or configures logging.
Each command group has its own `_add_*` function below; keep them apart.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from embedcache.errors import EmbedcacheError
from embedcache.models.options import POOLINGS

if TYPE_CHECKING:
    from collections.abc import Iterator

logger = logging.getLogger(__name__)


def _default_store() -> str:
    return os.environ.get("EMBEDCACHE_STORE", "store")


# Per cloud, the standard environment variables handed to the store as options.
_STORAGE_ENV = {
    "s3": (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_ENDPOINT_URL",
        "AWS_ALLOW_HTTP",
        "AWS_SKIP_SIGNATURE",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST",
    ),
    "gs": (
        "GOOGLE_SERVICE_ACCOUNT",
        "GOOGLE_SERVICE_ACCOUNT_KEY",
        "GOOGLE_APPLICATION_CREDENTIALS",
    ),
    "az": (
        "AZURE_STORAGE_ACCOUNT_NAME",
        "AZURE_STORAGE_ACCOUNT_KEY",
        "AZURE_STORAGE_SAS_KEY",
        "AZURE_STORAGE_TOKEN",
        "AZURE_STORAGE_USE_EMULATOR",
        "AZURE_ALLOW_HTTP",
    ),
}
_CLOUD_OF_SCHEME = {"s3": "s3", "s3a": "s3", "gs": "gs"} | dict.fromkeys(
    ("az", "abfs", "abfss", "azure", "adl"), "az"
)


def storage_options(location: str) -> dict[str, str]:
    """The store options for a URL, from its cloud's environment variables.

    Plain strings: a cluster client can send them with the URL to its workers,
    which open ``EmbeddingStore(location, options=...)`` themselves.
    """
    cloud = _CLOUD_OF_SCHEME.get(location.partition("://")[0].lower())
    names = _STORAGE_ENV.get(cloud, ()) if "://" in location else ()
    return {name.lower(): os.environ[name] for name in names if os.environ.get(name)}


def _store_at(location: str, **kwargs: object) -> object:
    """Open the store at a folder or URL with the options the environment gives."""
    from embedcache.store import EmbeddingStore

    return EmbeddingStore(location, options=storage_options(location), **kwargs)


def _default_data_dir() -> Path | None:
    value = os.environ.get("EMBEDCACHE_DATA_DIR")
    return Path(value) if value else None


def _default_cluster() -> str | None:
    return os.environ.get("EMBEDCACHE_CLUSTER") or None


# --- foundation: versions, subset ---------------------------------------------------


def _add_data_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "versions", help="list the leaderboard versions with their datasets and n"
    )
    p.set_defaults(func=_cmd_versions)

    p = sub.add_parser("subset", help="draw a version's items and write its manifest")
    p.add_argument(
        "--version",
        required=True,
        help="a shipped version name or a version .toml file",
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=_default_data_dir(),
        help="local mirror of the datasets",
    )
    p.add_argument("--output", type=Path, required=True, help="manifest TSV to write")
    p.set_defaults(func=_cmd_subset)


def _cmd_versions(args: argparse.Namespace) -> int:
    from embedcache.data.versions import list_versions

    for version in list_versions():
        flag = "" if version.comparable else "  (not comparable to the leaderboard)"
        print(f"{version.name}  seed={version.seed}{flag}")
        for draw in version.datasets:
            n_test = (
                draw.n_test
                if draw.n_test is not None
                else ("rest" if draw.self_split else "all")
            )
            print(f"  {draw.name:<34} test={n_test!s:<6} train={draw.n_train}")
    return 0


def _cmd_subset(args: argparse.Namespace) -> int:
    from embedcache.data.subsets import draw_version, write_manifest
    from embedcache.data.versions import load_version

    subset = draw_version(load_version(args.version), data_dir=args.data_dir)
    write_manifest(subset, args.output)
    counts = subset.items.group_by("dataset", "split").len().sort("dataset", "split")
    for dataset, split, n in counts.iter_rows():
        print(f"{dataset:<34} {split:<5} {n}")
    print(f"wrote {subset.items.height} items to {args.output}")
    print(f"subset_id={subset.subset_id}")
    return 0


# --- store: ls, info, verify, compact -----------------------------------------------


def _add_store_commands(sub: argparse._SubParsersAction) -> None:
    store = sub.add_parser(
        "store", help="inspect, verify, compact and migrate an embedding store"
    )
    actions = store.add_subparsers(dest="store_command", required=True)
    helps = {
        "ls": "list model keys with counts, sizes and aliases",
        "info": "show each key's full JSON, counts, aliases and leftovers",
        "verify": "check every committed object's size and sha256; non-zero exit on a fault",
        "compact": "merge each key's shards into one, drop duplicates and dead leftovers",
        "migrate": "convert a store written by embedcache 0.1 (schema 1) in place",
    }
    handlers = {
        "ls": _cmd_store_ls,
        "info": _cmd_store_info,
        "verify": _cmd_store_verify,
        "compact": _cmd_store_compact,
        "migrate": _cmd_store_migrate,
    }
    for name, text in helps.items():
        p = actions.add_parser(name, help=text)
        p.add_argument(
            "--store",
            default=None,
            help="embedding store: a folder or s3://, gs://, az:// URL "
            "(default: $EMBEDCACHE_STORE or ./store)",
        )
        if name in {"info", "compact"}:
            p.add_argument(
                "--key", default=None, help="only keys whose digest starts so"
            )
        p.set_defaults(func=handlers[name])


def _open_store(args: argparse.Namespace) -> object:
    return _store_at(args.store or _default_store(), create=False)


def _selected_keys(store: object, prefix: str | None) -> list:
    infos = store.keys()
    chosen = [i for i in infos if prefix is None or i.digest.startswith(prefix)]
    if prefix is not None and not chosen:
        from embedcache.errors import StoreError

        msg = f"no key in {store.root} has a digest starting with {prefix!r}; see `store ls`"
        raise StoreError(msg)
    return chosen


def _cmd_store_ls(args: argparse.Namespace) -> int:
    store = _open_store(args)
    infos = store.keys()
    print(
        f"{'digest':12}  {'n_vectors':>9}  {'dim':>5}  {'shards':>6}  {'MB':>8}  model"
    )
    for i in infos:
        aliases = f"  aka {', '.join(i.aliases)}" if i.aliases else ""
        print(
            f"{i.digest[:12]}  {i.n_vectors:>9}  {i.dim:>5}  {i.n_shards:>6}  "
            f"{i.nbytes / 1e6:>8.1f}  {i.key.short()}{aliases}"
        )
    print(f"{len(infos)} keys in {store.root}")
    return 0


def _cmd_store_info(args: argparse.Namespace) -> int:
    import json

    store = _open_store(args)
    garbage = store.garbage()
    for i in _selected_keys(store, args.key):
        print(f"key {i.digest}")
        print(f"  vectors {i.n_vectors} x {i.dim} float32 in {i.n_shards} shard(s)")
        print(f"  {i.nbytes:,} bytes stored")
        print(f"  aliases: {', '.join(i.aliases) or '(none)'}")
        leftovers = sum(1 for g in garbage if i.digest in g)
        print(f"  leftovers awaiting removal: {leftovers}")
        print(f"  model key {i.key.canonical_json()}")
        print("  " + json.dumps(i.key.to_dict(), indent=2).replace("\n", "\n  "))
    return 0


def _cmd_store_verify(args: argparse.Namespace) -> int:
    store = _open_store(args)
    faults = store.verify()
    for fault in faults:
        print(f"FAULT {fault.path}: {fault.problem}")
    for path in store.garbage():
        print(f"garbage {path} (ignored by readers; `store compact` removes it)")
    if faults:
        print(f"{len(faults)} fault(s) in {store.root}", file=sys.stderr)
        return 1
    print(f"ok: every committed shard in {store.root} verified")
    return 0


def _cmd_store_compact(args: argparse.Namespace) -> int:
    store = _open_store(args)
    for i in _selected_keys(store, args.key):
        store.compact(i.key)
        print(
            f"compacted {i.digest[:12]} ({i.n_vectors} vectors, was {i.n_shards} shards)"
        )
    return 0


def _cmd_store_migrate(args: argparse.Namespace) -> int:
    from embedcache.store import migrate_store

    location = args.store or _default_store()
    done = migrate_store(location, options=storage_options(location))
    if done.from_version == 2:
        print(f"{location} is already schema_version 2: nothing to do")
    else:
        print(
            f"migrated {location} from schema_version {done.from_version} to 2: "
            f"{done.n_keys} keys, {done.n_shards} shards (nothing recomputed)"
        )
    return 0


# --- engine: embed, embeddings ------------------------------------------------------


_COUNTS_NOTE = (
    "The last line printed is `computed=<N> cached=<M>`: N distinct sequences ran "
    "through the model, M counts every other input row (already in the store, or a "
    "repeat of a sequence computed in this run); N + M is the number of inputs."
)


def _add_embed_commands(sub: argparse._SubParsersAction) -> None:
    """`embed` (any sequences -> OUT.npy) and `embeddings` (every item of a version).

    Both print `computed=<N> cached=<M>` as their last stdout line: N distinct
    sequences run through the model, M every other input row (already stored, or a
    repeat of a sequence computed in the same run), so N + M = number of inputs.
    """

    def add_model_options(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--model",
            required=True,
            help="kmer-1..kmer-6, gc, a local HF directory, or a hub id",
        )
        p.add_argument(
            "--store",
            default=None,
            help="embedding store: a folder or s3://, gs://, az:// URL "
            "(default: $EMBEDCACHE_STORE or ./store)",
        )
        p.add_argument(
            "--revision", default=None, help="hub revision; resolved to a commit sha"
        )
        p.add_argument(
            "--dtype",
            choices=("float32", "bfloat16"),
            default="float32",
            help="compute dtype",
        )
        p.add_argument(
            "--device", default="auto", help="auto (cuda if present), cpu, cuda, cuda:N"
        )
        p.add_argument(
            "--rc",
            choices=("none", "average"),
            default=None,
            help="reverse-complement mode (default: the family's)",
        )
        p.add_argument(
            "--layer", type=int, default=-1, help="hidden layer to pool (-1: last)"
        )
        p.add_argument(
            "--layers",
            default=None,
            metavar="all|L1,L2,...",
            help="a layer sweep from one forward pass, each layer under its own key: "
            "'all' (the last, -1, then 0 = embeddings and every block before the "
            "last) or a comma list such as 2,6,12 (the first listed goes to --output)",
        )
        p.add_argument(
            "--pooling",
            choices=POOLINGS,
            default="mean",
            help="mean over the sequence's tokens (the protocol's), cls (the "
            "classification token, where the family has one) or last (the last "
            "token, causal families)",
        )
        p.add_argument(
            "--random-init",
            type=int,
            default=None,
            metavar="SEED",
            help="the architecture with seeded random weights (a pretraining control)",
        )
        p.add_argument(
            "--family-option",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="an option only the model's family understands (repeatable)",
        )
        p.add_argument(
            "--include-special-tokens",
            action="store_true",
            help="pool [CLS]/[SEP]-style tokens too",
        )
        p.add_argument(
            "--truncate",
            action="store_true",
            help="cut over-long sequences on the right (recorded in the key)",
        )
        p.add_argument(
            "--kmer-split",
            type=int,
            default=None,
            metavar="K",
            help="DNABERT-style overlapping K-mer input",
        )
        p.add_argument(
            "--trust-remote-code",
            action="store_true",
            help="run the model repository's own code",
        )
        p.add_argument(
            "--token-budget",
            type=_positive_int,
            default=None,
            help="padded tokens per forward pass",
        )
        p.add_argument("--no-progress", action="store_true", help="no progress bar")
        p.add_argument(
            "--threads",
            type=_positive_int,
            default=None,
            help="torch CPU threads (default: torch's, one per core; on a busy "
            "shared machine 1 can be faster); with --cluster local:N, threads per worker",
        )
        _add_cluster_options(p)

    p = sub.add_parser(
        "embed",
        help="embed sequences from a file into OUT.npy, caching in the store",
        description=_COUNTS_NOTE,
    )
    add_model_options(p)
    p.add_argument(
        "--input",
        type=Path,
        required=True,
        help="TSV with a 'seq' column, FASTA, or one sequence a line",
    )
    p.add_argument(
        "--output",
        type=Path,
        required=True,
        help="float32 (n, d) .npy, rows in input order",
    )
    p.set_defaults(func=_cmd_embed)

    p = sub.add_parser(
        "embeddings",
        help="embed every item (train and test) of a leaderboard version",
        description=_COUNTS_NOTE,
    )
    add_model_options(p)
    p.add_argument(
        "--version",
        required=True,
        help="version name (e.g. atlas-full-v1) or a .toml file",
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="local dataset folder (default: $EMBEDCACHE_DATA_DIR)",
    )
    p.set_defaults(func=_cmd_embeddings)


def _family_options(pairs: list[str]) -> tuple[tuple[str, str], ...]:
    from embedcache.errors import AdapterOptionError

    out = []
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            msg = f"--family-option {pair!r} is not NAME=VALUE"
            raise AdapterOptionError(msg)
        out.append((name.strip(), value.strip()))
    return tuple(out)


def _layers(args: argparse.Namespace) -> tuple[int, ...]:
    """--layer L, or --layers all|L1,L2,... (all: -1 first, then 0..n-1)."""
    from embedcache.errors import AdapterOptionError

    spec = getattr(args, "layers", None)
    if spec is None:
        return (args.layer,)
    if args.layer != -1:
        msg = "give --layer or --layers, not both"
        raise AdapterOptionError(msg)
    if spec.strip().lower() == "all":
        from embedcache.models import layer_count

        n = layer_count(args.model, revision=args.revision)
        return (-1, *range(n))
    try:
        layers = tuple(int(part) for part in spec.split(",") if part.strip())
    except ValueError as err:
        msg = f"--layers {spec!r} is not 'all' or a comma list of integers like 2,6,12"
        raise AdapterOptionError(msg) from err
    if not layers:
        msg = "--layers names no layer"
        raise AdapterOptionError(msg)
    return layers


def _embed_options(args: argparse.Namespace) -> dict[str, object]:
    """The EmbedOptions fields the embedding commands set (also sent to workers)."""
    return {
        "dtype": args.dtype,
        "device": args.device,
        "rc_mode": args.rc,
        "layers": _layers(args),
        "pooling": args.pooling,
        "special_tokens": "include" if args.include_special_tokens else "exclude",
        "truncation": "right" if args.truncate else "error",
        "kmer_split": args.kmer_split,
        "random_init": args.random_init,
        "family_options": _family_options(args.family_option),
        "trust_remote_code": args.trust_remote_code,
    }


def _embed_adapter(args: argparse.Namespace) -> object:
    from embedcache.models import load_adapter

    return load_adapter(args.model, revision=args.revision, **_embed_options(args))


def _run_embedding(
    args: argparse.Namespace, seqs: list[str], names: list[str]
) -> object:
    from embedcache.engine.embed import embed_sequences

    if args.cluster and args.cluster.strip().lower() != "none":
        return _run_on_cluster(args, seqs, names)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    adapter = _embed_adapter(args)
    store = _store_at(args.store or _default_store())
    return embed_sequences(
        adapter,
        seqs,
        store,
        names=names,
        token_budget=args.token_budget,
        progress=not args.no_progress and sys.stderr.isatty(),
    )


def _add_cluster_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cluster",
        default=_default_cluster(),
        metavar="SPEC",
        help="run on Dask: local:N starts N worker processes for this run, "
        "tcp://HOST:PORT uses a running scheduler (default: $EMBEDCACHE_CLUSTER; "
        "unset or 'none': in this process). The store must be reachable by every worker",
    )
    p.add_argument(
        "--unit-tokens",
        type=_positive_int,
        default=None,
        metavar="N",
        help="with --cluster: sequence tokens per work unit (default: sized to a "
        "few seconds of a worker's measured rate, 4k-1M tokens)",
    )


def _run_on_cluster(
    args: argparse.Namespace, seqs: list[str], names: list[str]
) -> object:
    from embedcache.engine.cluster import embed_on_cluster, open_cluster

    if not getattr(args, "verbose", False):
        # Dask logs every worker and connection (its import set its level to INFO);
        # embedcache's own lines say what runs where
        logging.getLogger("distributed").setLevel(logging.WARNING)
    location = args.store or _default_store()
    with open_cluster(args.cluster, threads_per_worker=args.threads) as client:
        return embed_on_cluster(
            client,
            args.model,
            seqs,
            location,
            store_options=storage_options(location),
            revision=args.revision,
            options=_embed_options(args),
            names=names,
            token_budget=args.token_budget,
            unit_tokens=args.unit_tokens,
            progress=not args.no_progress and sys.stderr.isatty(),
        )


def _cmd_embed(args: argparse.Namespace) -> int:
    import numpy as np

    from embedcache.data.seqfile import read_sequences

    if args.output.suffix != ".npy":
        print(
            f"embedcache: error: --output {args.output} must end in .npy",
            file=sys.stderr,
        )
        return 2
    records = read_sequences(args.input)
    result = _run_embedding(args, records.seqs, records.names)
    _save_npy_atomic(args.output, np.asarray(result.vectors, dtype=np.float32))
    print(
        f"wrote {result.vectors.shape[0]} x {result.vectors.shape[1]} float32 to {args.output}"
    )
    layers = _layers(args)
    if len(layers) > 1:
        print(
            f"{args.output} holds layer {layers[0]}; layers {list(layers)} are stored"
        )
    print(f"computed={result.n_computed} cached={result.n_cached}")
    return 0


def _cmd_embeddings(args: argparse.Namespace) -> int:
    from embedcache.data.subsets import draw_version
    from embedcache.data.versions import load_version

    version = load_version(args.version)
    subset = draw_version(version, data_dir=args.data_dir or _default_data_dir())
    items = subset.items
    result = _run_embedding(args, items["seq"].to_list(), items["item_id"].to_list())
    print(
        f"{version.name} (subset {subset.subset_id}): {items.height} items embedded with {args.model}"
    )
    print(f"computed={result.n_computed} cached={result.n_cached}")
    return 0


def _save_npy_atomic(path: Path, array: object) -> None:
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as fh:
            np.save(fh, array)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


# --- export: a version's items with one model's vectors ----------------------------


def _add_export_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="write every item of a version with one model's stored vector "
        "(.parquet or .npz), to probe in your own code",
        description="One row per item (train and test): item_id, dataset, split, "
        "label, seq_sha256 and the float32 vector (a fixed-size array column in "
        ".parquet; an (n, d) array in .npz).",
    )
    p.add_argument(
        "--model",
        required=True,
        help="a model id in the store, or a key digest prefix (8+ hex digits) "
        "when several keys share the id",
    )
    p.add_argument(
        "--version", required=True, help="a shipped version name or a version .toml"
    )
    p.add_argument(
        "--output", type=Path, required=True, help="FILE.parquet or FILE.npz"
    )
    p.add_argument(
        "--store",
        default=None,
        help="embedding store: a folder or s3://, gs://, az:// URL "
        "(default: $EMBEDCACHE_STORE or ./store)",
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="local dataset folder (default: $EMBEDCACHE_DATA_DIR)",
    )
    p.set_defaults(func=_cmd_export)


def _cmd_export(args: argparse.Namespace) -> int:
    from embedcache.data.subsets import draw_version
    from embedcache.data.versions import load_version
    from embedcache.report.export import check_format, export_frame, write_export

    check_format(args.output)  # before the draw, which can take a while
    version = load_version(args.version)
    store = _store_at(args.store or _default_store(), create=False)
    subset = draw_version(version, data_dir=args.data_dir or _default_data_dir())
    export = export_frame(subset, store, args.model)
    write_export(export, args.output)
    print(
        f"{version.name} (subset {subset.subset_id}): wrote {export.frame.height} items "
        f"x {export.dim} float32 of {export.key.short()} (key {export.key.digest[:12]}) "
        f"to {args.output}"
    )
    return 0


# --- models: the supported families and known checkpoints ---------------------------


def _add_models_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "models", help="list the supported model families and known checkpoints"
    )
    p.set_defaults(func=_cmd_models)


def _cmd_models(args: argparse.Namespace) -> int:
    from embedcache.models import BUILTIN_MODELS, FAMILY_MODULES, family_module
    from embedcache.models.catalogue import load_catalogue

    print("families (recognised from config.json, most specific first):")
    for name in FAMILY_MODULES:
        module = family_module(name)
        summary = (module.__doc__ or "").strip().splitlines()[0]
        print(f"  {module.FAMILY:<12} {summary}")
    print(f"built-in floors: {', '.join(BUILTIN_MODELS)}")
    print()
    columns = ("hub_id", "family", "params", "context", "rc_default", "licence")
    entries = load_catalogue()
    widths = {
        c: max(len(c), *(len(str(getattr(e, c))) for e in entries)) for c in columns
    }
    print("  ".join(f"{c:<{widths[c]}}" for c in columns) + "  loading")
    for e in entries:
        cells = "  ".join(f"{getattr(e, c)!s:<{widths[c]}}" for c in columns)
        print(f"{cells}  {e.loading}; tokens: {e.tokenizer}")
    print(
        f"{len(entries)} known checkpoints; any other checkpoint whose config.json "
        "is recognised loads too"
    )
    return 0


# --- report, demo -------------------------------------------------------------------


def _add_report_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="probe a version's stored embeddings and render reports/<version>/",
    )
    p.add_argument(
        "--version", required=True, help="a shipped version name or a version .toml"
    )
    p.add_argument(
        "--store", default=_default_store(), help="a folder or s3://, gs://, az:// URL"
    )
    p.add_argument("--data-dir", type=Path, default=_default_data_dir())
    p.add_argument(
        "--models",
        nargs="*",
        default=[],
        help="model ids to rank (default: every non-floor model in the store)",
    )
    p.add_argument("--output-dir", type=Path, default=Path("reports"))
    p.add_argument(
        "--n-boot", type=_positive_int, default=1000, help="bootstrap resamples"
    )
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.set_defaults(func=_cmd_report)


def _cmd_report(args: argparse.Namespace) -> int:
    import polars as pl

    from embedcache.data.versions import load_version
    from embedcache.report.render import render_report

    spec = load_version(args.version)
    paths = render_report(
        args.version,
        store=args.store,
        data_dir=args.data_dir,
        models=args.models,
        output_dir=args.output_dir,
        n_boot=args.n_boot,
        seed=args.seed,
    )
    results = pl.read_csv(paths.results)
    means = results.filter(
        (pl.col("dataset") == "mean") & (pl.col("metric") == "accuracy")
    ).sort("value", descending=True)
    label = "" if spec.comparable else " (not comparable to the leaderboard)"
    print(f"{spec.name}{label}: mean accuracy [95% CI], n")
    for row in means.iter_rows(named=True):
        floor = " (floor)" if row["is_floor"] else ""
        print(
            f"  {row['model']:<40} {row['value']:.3f} "
            f"[{row['ci_low']:.3f}, {row['ci_high']:.3f}] n={row['n']}{floor}"
        )
    print(f"notebook: {paths.notebook}")
    print(f"results:  {paths.results}")
    print(f"report:   {paths.html}")
    return 0


# --- demo: the whole pipeline, offline -----------------------------------------------


def _add_demo_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="offline: draw demo-v1, embed it with the built-in floors and a "
        "random-init Caduceus control, render its report",
    )
    p.add_argument(
        "--store", default=_default_store(), help="a folder or s3://, gs://, az:// URL"
    )
    p.add_argument("--output-dir", type=Path, default=Path("reports"))
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    from embedcache.models import BUILTIN_MODELS

    version = "demo-v1"
    store = str(args.store)
    steps = [
        [
            "subset",
            "--version",
            version,
            "--output",
            str(args.output_dir / version / "manifest.tsv"),
        ]
    ]
    steps += [
        ["embeddings", "--model", m, "--version", version, "--store", store]
        for m in BUILTIN_MODELS
    ]
    # the neural row: a random-init Caduceus (shipped config, no trained weights),
    # labelled as a control, with every layer for the layer sweep
    steps.append(
        [
            "embeddings",
            "--model",
            "caduceus-tiny",
            "--random-init",
            "0",
            "--layers",
            "all",
            "--version",
            version,
            "--store",
            store,
        ]
    )
    steps.append(
        [
            "report",
            "--version",
            version,
            "--store",
            store,
            "--output-dir",
            str(args.output_dir),
        ]
    )
    parser = build_parser()
    for step in steps:
        print(f"$ embedcache {' '.join(step)}", flush=True)
        step_args = parser.parse_args(step)
        code = int(step_args.func(step_args) or 0)
        if code:
            return code
    print(
        f"demo report: {args.output_dir / version / 'index.html'} (demo-v1 is not comparable to the leaderboard)"
    )
    return 0


def _positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        msg = f"must be a positive whole number, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="embedcache", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log at debug level"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_data_commands(sub)
    _add_store_commands(sub)
    _add_embed_commands(sub)
    _add_export_command(sub)
    _add_models_command(sub)
    _add_report_commands(sub)
    _add_demo_command(sub)
    return parser


@contextlib.contextmanager
def _kernel_cache_env() -> Iterator[None]:
    """Point numba's kernel cache at a user cache dir for one command, unless set.

    Numba reads ``NUMBA_CACHE_DIR`` when a kernel module is first imported, and the
    worker processes a command starts inherit it; so compiled kernels are written
    outside the (possibly read-only) installed package and reused by later runs. A
    ``NUMBA_CACHE_DIR`` the user set wins; an unusable dir leaves numba its defaults.
    """
    from embedcache.models.jitcache import default_cache_dir

    if os.environ.get("NUMBA_CACHE_DIR"):
        yield
        return
    try:
        path = default_cache_dir(
            xdg_cache_home=os.environ.get("XDG_CACHE_HOME"), home=Path.home()
        )
        path.mkdir(parents=True, exist_ok=True)
    except (OSError, RuntimeError) as err:  # RuntimeError: no home directory
        logger.debug(
            "no user cache dir for compiled kernels (%s); numba's default", err
        )
        yield
        return
    os.environ["NUMBA_CACHE_DIR"] = str(path)
    try:
        yield
    finally:
        os.environ.pop("NUMBA_CACHE_DIR", None)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        # the hub client logs every retry; our own error says what failed and what to do
        logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    if getattr(args, "no_progress", False) or not sys.stderr.isatty():
        # read by huggingface_hub and transformers at import: no download or
        # weight-loading bars either (an explicit setting of the user's wins)
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        with _kernel_cache_env():
            return int(args.func(args) or 0)
    except EmbedcacheError as err:
        notes = "".join(f"\n  {note}" for note in getattr(err, "__notes__", ()))
        print(f"embedcache: error: {err}{notes}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("embedcache: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # output piped into `head` and the like: stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
