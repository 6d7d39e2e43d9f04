"""Timing several variants side by side: in turns, best round of each."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable


def side_by_side(fns: dict[str, Callable[[], object]], rounds: int = 15) -> dict:
    """Best time of each, measured in turns so that all see the same load."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {name: min(ts) for name, ts in times.items()}
