"""`embedcache models`: the supported model families and the known checkpoints."""

from __future__ import annotations

import argparse


def add_models_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "models", help="list the supported model families and known checkpoints"
    )
    p.set_defaults(func=_cmd_models)


def _cmd_models(args: argparse.Namespace) -> int:
    from embedcache.models import (
        BUILTIN_MODELS,
        FAMILY_MODULES,
        cpu_kind,
        family_module,
        resolve_dtype,
    )
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
    print(
        f"this machine: CPU kind {cpu_kind()}; --dtype auto computes in "
        f"{resolve_dtype('auto', 'cpu')} on its CPU (bfloat16 on a GPU with bf16)"
    )
    from embedcache.models.shared.tuning import process_tuner

    tuner = process_tuner()
    lines = tuner.stored()
    print(
        f"kernel choices tuned on this machine ({tuner.path}; EMBEDCACHE_TUNE=off "
        "or KERNEL=CHOICE overrides):" + ("" if lines else " none yet")
    )
    for line in lines:
        print(f"  {line}")
    return 0
