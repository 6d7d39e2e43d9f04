"""`embedcache store ls|info|verify|compact|repair|collect|migrate`: inspect and
maintain a store."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from embedcache.cli.common import (
    add_store_argument,
    default_store,
    open_store,
    store_options,
)

if TYPE_CHECKING:
    from embedcache.store import EmbeddingStore, KeyInfo


def add_store_commands(sub: argparse._SubParsersAction) -> None:
    store = sub.add_parser(
        "store", help="inspect, verify, compact and migrate an embedding store"
    )
    actions = store.add_subparsers(dest="store_command", required=True)
    helps = {
        "ls": "list model keys with counts, sizes and aliases",
        "info": "show each key's full JSON, counts, aliases, leftovers and the kernels that computed it",
        "verify": "check every committed object's size and sha256; non-zero exit on a fault",
        "compact": "merge each key's runs into one, drop duplicates and dead leftovers",
        "migrate": "convert a store of an older schema (1 to 4): copy, verify, then flip",
        "repair": "drop the runs that fail their checks (their rows are recomputed)",
        "collect": "remove garbage this process watched sit still (--watch: keep at it)",
    }
    handlers = {
        "ls": _cmd_store_ls,
        "info": _cmd_store_info,
        "verify": _cmd_store_verify,
        "compact": _cmd_store_compact,
        "migrate": _cmd_store_migrate,
        "repair": _cmd_store_repair,
        "collect": _cmd_store_collect,
    }
    for name, text in helps.items():
        p = actions.add_parser(name, help=text)
        add_store_argument(p)
        if name in {"info", "compact", "repair", "collect"}:
            p.add_argument(
                "--key", default=None, help="only keys whose digest starts so"
            )
        if name == "repair":
            p.add_argument(
                "--dry-run",
                action="store_true",
                help="print what would be dropped; change nothing",
            )
        if name == "collect":
            _add_collect_options(p)
        p.set_defaults(func=handlers[name])


def _add_collect_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--watch",
        action="store_true",
        help="keep collecting every --every seconds until stopped: only a process "
        "that watched a leftover sit still (its writer's lease and margin; a run "
        "merged away: its grace) removes it",
    )
    p.add_argument(
        "--every", type=float, default=60.0, help="seconds between passes (60)"
    )
    p.add_argument(
        "--rounds", type=int, default=None, help="stop after this many passes"
    )


def _selected_keys(store: EmbeddingStore, prefix: str | None) -> list[KeyInfo]:
    infos = store.keys()
    chosen = [i for i in infos if prefix is None or i.digest.startswith(prefix)]
    if prefix is not None and not chosen:
        from embedcache.errors import StoreError

        msg = f"no key in {store.root} has a digest starting with {prefix!r}; see `store ls`"
        raise StoreError(msg)
    return chosen


def _cmd_store_ls(args: argparse.Namespace) -> int:
    store = open_store(args.store)
    infos = store.keys()
    print(f"{'digest':12}  {'n_vectors':>9}  {'dim':>5}  {'runs':>6}  {'MB':>8}  model")
    for i in infos:
        aliases = f"  aka {', '.join(i.aliases)}" if i.aliases else ""
        print(
            f"{i.digest[:12]}  {i.n_vectors:>9}  {i.dim:>5}  {i.n_runs:>6}  "
            f"{i.nbytes / 1e6:>8.1f}  {i.key.short()}{aliases}"
        )
    print(f"{len(infos)} keys in {store.root}")
    return 0


def _cmd_store_info(args: argparse.Namespace) -> int:
    import json

    store = open_store(args.store)
    garbage = store.garbage()
    for i in _selected_keys(store, args.key):
        print(f"key {i.digest}")
        print(f"  vectors {i.n_vectors} x {i.dim} float32 in {i.n_runs} run(s)")
        print(f"  {i.nbytes:,} bytes stored")
        print(f"  aliases: {', '.join(i.aliases) or '(none)'}")
        # which kernels computed the vectors (recorded by each commit; not the key)
        print("  computed by:" + ("" if i.kernels else " (not recorded)"))
        for kernels in i.kernels:
            print(f"    {kernels}")
        leftovers = sum(1 for g in garbage if i.digest in g)
        print(f"  leftovers awaiting removal: {leftovers}")
        print(f"  model key {i.key.canonical_json()}")
        print("  " + json.dumps(i.key.to_dict(), indent=2).replace("\n", "\n  "))
    return 0


def _cmd_store_verify(args: argparse.Namespace) -> int:
    store = open_store(args.store)
    faults = store.verify()
    for fault in faults:
        print(f"FAULT {fault.path}: {fault.problem}")
    for path in store.garbage():
        print(
            f"garbage {path} (ignored by readers; removed by a long-lived process's "
            "collection once it has watched it and its writer's lease sit still for "
            "the lease plus its margin: `embedcache store collect --watch`; a one-shot "
            "process judges nothing dead)"
        )
    if faults:
        print(f"{len(faults)} fault(s) in {store.root}", file=sys.stderr)
        return 1
    print(f"ok: every committed run in {store.root} verified")
    return 0


def _cmd_store_compact(args: argparse.Namespace) -> int:
    store = open_store(args.store)
    for i in _selected_keys(store, args.key):
        store.compact(i.key)
        print(f"compacted {i.digest[:12]} ({i.n_vectors} vectors, was {i.n_runs} runs)")
    return 0


def _cmd_store_repair(args: argparse.Namespace) -> int:
    store = open_store(args.store)
    broken = store.repair(args.key, dry_run=args.dry_run)
    verb = "would drop" if args.dry_run else "dropped"
    for b in broken:
        print(f"{verb} {b}")
    if not broken:
        print(f"nothing to repair: every published run in {store.root} verified")
    elif not args.dry_run:
        print(
            f"{len(broken)} broken run(s) dropped from {store.root}; their rows are "
            "computed again by the next embed"
        )
    return 0


def _cmd_store_collect(args: argparse.Namespace) -> int:
    from embedcache.store.collection import watch

    store = open_store(args.store)
    rounds = args.rounds if args.rounds is not None else (None if args.watch else 1)
    passes = watch(lambda: store.collect(args.key), every=args.every, rounds=rounds)
    for number, removed in enumerate(passes, 1):
        for run in removed:
            print(f"removed run {run}", flush=True)
        print(
            f"pass {number}: removed {len(removed)} run(s) from {store.root}",
            flush=True,
        )
    return 0


def _cmd_store_migrate(args: argparse.Namespace) -> int:
    from embedcache.store import SCHEMA_VERSION, migrate_store

    location = args.store or default_store()
    done = migrate_store(location, options=store_options(location))
    if done.from_version == SCHEMA_VERSION:
        print(f"{location} is already schema_version {SCHEMA_VERSION}: nothing to do")
    else:
        print(
            f"migrated {location} from schema_version {done.from_version} to "
            f"{SCHEMA_VERSION}: "
            f"{done.n_keys} keys, {done.n_runs} runs (nothing recomputed)"
        )
    return 0
