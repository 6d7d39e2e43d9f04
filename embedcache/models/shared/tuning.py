"""Choose, per machine, the fastest of a kernel's equivalent implementations.

A *problem* is one kernel at one (dtype, length bucket, shape) on this machine; its
*candidates* are implementations that must give the same vectors within the dtype's
tolerance. :meth:`Tuner.choose` runs every candidate once on a synthetic input,
drops any whose output differs from the first candidate's (the reference, today's
implementation) by more than the tolerance, times the rest and keeps the fastest.
That check is what lets the choice stay out of the embedding key: every eligible
candidate computes the key's vectors within the dtype's tolerance, so which one ran
is a property of the machine, not of the vectors (the key's promise is "within
tolerance across machines"; on one machine the choice is fixed by the cache).

Choices are cached in ``tuning.json`` beside the numba kernel cache
(``NUMBA_CACHE_DIR``'s parent, ``~/.cache/embedcache`` by default), under a fingerprint of the CPU kind and the library versions: a new fingerprint
starts afresh, so a machine or library change re-tunes; so does a problem whose
candidates are not the ones its cached choice was made among.

``EMBEDCACHE_TUNE=off`` takes every problem's reference candidate without timing;
``EMBEDCACHE_TUNE=attention=math,scan=blocked`` names a choice per kernel (the other
kernels are tuned).

:meth:`Tuner.recording` collects the choices made while a block runs (a forward
pass): the engine records them, with the CPU kind and torch version, in the commit
of the vectors they computed, so a difference between machines can be explained.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import threading
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from embedcache import errors

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence

logger = logging.getLogger(__name__)

TUNER_VERSION = 1
CACHE_NAME = "tuning.json"
ENV_VAR = "EMBEDCACHE_TUNE"
OFF = "off"
# vectors of two candidates may differ by this much, relative to the output's scale
TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 2e-3}
_NO_OVERRIDE: Mapping[str, str] = MappingProxyType({})
_LIBRARIES = ("torch", "numba", "llvmlite", "numpy", "embedcache")


class TuningError(errors.EmbedcacheError, ValueError):
    """A bad ``EMBEDCACHE_TUNE`` value, or a forced choice no candidate has."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One kernel at one (dtype, length bucket, shape); ``kernel`` is the name the
    override uses (``attention``, ``scan``, ``linear``, ``longconv``,
    ``budget``)."""

    kernel: str
    dtype: str
    bucket: str = "any"
    shape: str = ""

    def key(self) -> str:
        return f"{self.kernel}|{self.dtype}|{self.bucket}|{self.shape}"


@dataclass(frozen=True, slots=True)
class Candidate:
    """An implementation: ``run(inputs)`` returns an array-like output."""

    name: str
    run: Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class Choice:
    name: str
    how: str  # "timed", "cached", "forced", "off", "only"
    seconds: dict[str, float] = field(default_factory=dict)
    ineligible: dict[str, str] = field(default_factory=dict)

    def describe(self, problem: Problem) -> str:
        times = ", ".join(f"{n} {s * 1e3:.2f} ms" for n, s in self.seconds.items())
        dropped = "".join(
            f"; {n} not eligible: {why}" for n, why in self.ineligible.items()
        )
        return f"{problem.key()}: {self.name} ({self.how}{': ' + times if times else ''}{dropped})"


def parse_override(value: str | None) -> dict[str, str] | None:
    """``EMBEDCACHE_TUNE``'s value as {kernel: choice}; None for ``off``; {} unset."""
    if value is None or not value.strip():
        return {}
    if value.strip().lower() == OFF:
        return None
    forced = {}
    for item in value.split(","):
        kernel, sep, name = (part.strip() for part in item.partition("="))
        if not sep or not kernel or not name:
            msg = (
                f"{ENV_VAR}={value!r}: {item!r} is not KERNEL=CHOICE. Use `off`, or "
                "a comma-separated list such as `attention=math,scan=blocked`."
            )
            raise TuningError(msg)
        forced[kernel] = name
    return forced


def fingerprint(cpu_kind: str) -> dict[str, str]:
    """What invalidates the cached choices: the CPU kind and the library versions."""
    from importlib.metadata import PackageNotFoundError, version

    def ver(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "absent"

    libs = {name: ver(name) for name in _LIBRARIES}
    return {
        "tuner": str(TUNER_VERSION),
        "cpu_kind": cpu_kind,
        "machine": platform.machine(),
        "python": platform.python_version(),
        **libs,
    }


def _max_difference(got: Any, want: Any) -> float:  # noqa: ANN401 (array-likes)
    import numpy as np

    got = np.asarray(_as_numpy(got), dtype=np.float64)
    want = np.asarray(_as_numpy(want), dtype=np.float64)
    if got.shape != want.shape:
        return float("inf")
    scale = max(float(np.abs(want).max(initial=0.0)), 1e-30)
    return float(np.abs(got - want).max(initial=0.0)) / scale


def _as_numpy(x: Any) -> Any:  # noqa: ANN401
    return x.detach().float().cpu().numpy() if hasattr(x, "detach") else x


class Tuner:
    """Chooses per problem and remembers the choices (in ``path`` when given).

    Parameters
    ----------
    path
        The JSON cache; None keeps choices in memory only.
    fingerprint
        From :func:`fingerprint`; cached choices under another one are dropped.
    override
        From :func:`parse_override`: None is ``off``, else forced choices by kernel.
    repeats, budget
        Each candidate is timed up to ``repeats`` times or ``budget`` seconds.
    """

    def __init__(
        self,
        path: Path | None,
        *,
        fingerprint: Mapping[str, str],
        override: Mapping[str, str] | None = _NO_OVERRIDE,
        repeats: int = 3,
        budget: float = 0.5,
    ) -> None:
        self.path = path
        self.fingerprint = dict(fingerprint)
        self.override = dict(override or {})
        self.off = override is None
        self.repeats = repeats
        self.budget = budget
        self.choices: dict[str, Choice] = {}
        self._stored: dict[str, dict[str, Any]] = self._load()
        self._recordings = threading.local()  # per thread: forward passes may overlap

    def _load(self) -> dict[str, dict[str, Any]]:
        if self.path is None or not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            logger.warning("unreadable tuning cache %s: tuning again", self.path)
            return {}
        if data.get("fingerprint") != self.fingerprint:
            logger.info(
                "tuning cache %s is for another CPU kind or library versions: tuning again",
                self.path,
            )
            return {}
        return dict(data.get("choices", {}))

    def _save(self) -> None:
        if self.path is None:
            return
        data = {"fingerprint": self.fingerprint, "choices": self._stored}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            tmp.replace(self.path)
        except OSError as err:
            logger.warning("could not write the tuning cache %s: %s", self.path, err)

    def choose(
        self,
        problem: Problem,
        candidates: Sequence[Candidate],
        make_input: Callable[[], Any],
        *,
        tolerance: float | None = None,
        repeats: int | None = None,
    ) -> str:
        """The name of the candidate to run for ``problem`` (the first is the reference);
        ``repeats``: timed rounds at least (default the tuner's), for candidates that
        take seconds a run."""
        key = problem.key()
        names = [c.name for c in candidates]
        settled = self._settled(problem, names)
        if settled is not None:
            return self._record(key, settled)
        choice = self._tune(problem, candidates, make_input, tolerance, repeats)
        # another process on this machine may have tuned it meanwhile: the first
        # choice written stands, so both run the same kernel (the same bits)
        self._stored = {**self._stored, **self._load()}
        theirs = self._stored.get(key)
        if theirs is not None and theirs.get("candidates") == names:
            choice = Choice(
                theirs["choice"],
                "cached",
                theirs.get("seconds", {}),
                theirs.get("ineligible", {}),
            )
        else:
            self._stored[key] = {
                "choice": choice.name,
                "candidates": names,
                "seconds": choice.seconds,
                "ineligible": choice.ineligible,
            }
        self._save()
        return self._record(key, choice)

    def will_time(self, problem: Problem, names: Sequence[str]) -> bool:
        """Whether :meth:`choose` would time these candidates (no choice forced,
        cached or ``off``): a caller can say it will take a while."""
        return self._settled(problem, list(names)) is None

    def _settled(self, problem: Problem, names: list[str]) -> Choice | None:
        """The choice that needs no timing: forced, ``off``, the only candidate, or
        cached (this process's choices are in the cache too); else None."""
        key = problem.key()
        forced = self.override.get(problem.kernel)
        if forced is not None:
            if forced not in names:
                msg = (
                    f"{ENV_VAR} asks for {problem.kernel}={forced}, but {key} has the "
                    f"candidates {', '.join(names)}. Name one of them, or `off`."
                )
                raise TuningError(msg)
            return Choice(forced, "forced")
        if self.off or len(names) == 1:
            return Choice(names[0], "off" if self.off else "only")
        stored = self._stored.get(key)
        # a cached choice holds while the candidates are the ones it was chosen
        # among: a kernel added since (or removed) is a reason to time them again
        if stored is not None and stored.get("candidates") == names:
            return Choice(
                stored["choice"],
                "cached",
                stored.get("seconds", {}),
                stored.get("ineligible", {}),
            )
        return None

    def describe(self) -> list[str]:
        """One line per problem this process chose for: choice, how, times."""
        return [c.describe(_problem_of(k)) for k, c in self.choices.items()]

    def stored(self) -> list[str]:
        """One line per choice in the cache file (other processes' choices too)."""
        return [
            Choice(
                v["choice"], "cached", v.get("seconds", {}), v.get("ineligible", {})
            ).describe(_problem_of(k))
            for k, v in sorted(self._stored.items())
        ]

    @contextlib.contextmanager
    def recording(self) -> Iterator[dict[str, str]]:
        """Collect the choices this thread makes inside the block, as
        :meth:`kernel_record` would describe them (filled as the block runs)."""
        used: dict[str, str] = {}
        stack = self._recordings.__dict__.setdefault("stack", [])
        stack.append(used)
        try:
            yield used
        finally:
            stack.pop()  # a with block: last in, first out

    def kernel_record(self, used: Mapping[str, str]) -> dict[str, str]:
        """What computed a block's vectors: the CPU kind, torch's version and each
        problem's choice (by kernel, length bucket and shape; the key names the
        dtype). Never part of an embedding key."""
        out = {
            "cpu_kind": self.fingerprint.get("cpu_kind", "unknown"),
            "torch": self.fingerprint.get("torch", "absent"),
        }
        for key, name in sorted(used.items()):
            problem = _problem_of(key)
            where = " ".join(p for p in (problem.bucket, problem.shape) if p != "any")
            out[f"{problem.kernel} {where}".strip()] = name
        return out

    def _record(self, key: str, choice: Choice) -> str:
        for used in self._recordings.__dict__.get("stack", ()):
            used[key] = choice.name
        if key not in self.choices:
            # a fresh tuning is news once per machine; a cached choice shows with -v
            level = logging.INFO if choice.how == "timed" else logging.DEBUG
            logger.log(level, "kernel choice %s", choice.describe(_problem_of(key)))
        self.choices[key] = choice
        return choice.name

    def _tune(
        self,
        problem: Problem,
        candidates: Sequence[Candidate],
        make_input: Callable[[], Any],
        tolerance: float | None,
        repeats: int | None,
    ) -> Choice:
        limit = TOLERANCE.get(problem.dtype, 1e-5) if tolerance is None else tolerance
        inputs = make_input()
        reference = _as_numpy(candidates[0].run(inputs))
        eligible: list[Candidate] = []
        ineligible: dict[str, str] = {}
        for candidate in candidates:
            try:
                out = candidate.run(inputs)  # also compiles: not timed
            except Exception as err:  # noqa: BLE001 (a candidate that fails is not eligible)
                ineligible[candidate.name] = f"failed: {type(err).__name__}: {err}"
                continue
            diff = _max_difference(out, reference)
            if not diff <= limit:
                ineligible[candidate.name] = f"differs by {diff:.2e} > {limit:.0e}"
                continue
            eligible.append(candidate)
        seconds = self._time(eligible, inputs, repeats or self.repeats)
        best = min(seconds, key=seconds.__getitem__)
        return Choice(best, "timed", seconds, ineligible)

    def _time(
        self,
        candidates: list[Candidate],
        inputs: Any,  # noqa: ANN401
        repeats: int,
    ) -> dict[str, float]:
        """Best wall time each, in interleaved rounds (a burst of load from other
        processes then hits every candidate): ``repeats`` rounds, more while the
        budget lasts (up to 5x)."""
        best = {c.name: float("inf") for c in candidates}
        start = time.perf_counter()
        for round_ in range(5 * repeats):
            if round_ >= repeats and time.perf_counter() - start > self.budget:
                break
            for candidate in candidates:
                t0 = time.perf_counter()
                candidate.run(inputs)
                best[candidate.name] = min(
                    best[candidate.name], time.perf_counter() - t0
                )
        return best


def _problem_of(key: str) -> Problem:
    kernel, dtype, bucket, shape = key.split("|", 3)
    return Problem(kernel, dtype, bucket, shape)


def length_bucket(length: int) -> str:
    """The power-of-two bucket a padded length falls in (``<=512``)."""
    return f"<={1 << max(length - 1, 1).bit_length()}"


def cache_path(environ: Mapping[str, str]) -> Path:
    """``tuning.json`` beside the numba kernel cache: ``NUMBA_CACHE_DIR``'s parent, else
    where the CLI would point numba (so the Python API and the CLI choose alike)."""
    from embedcache.models.shared.jitcache import default_cache_dir

    numba_dir = environ.get("NUMBA_CACHE_DIR") or default_cache_dir(
        xdg_cache_home=environ.get("XDG_CACHE_HOME"), home=Path.home()
    )
    return Path(numba_dir).parent / CACHE_NAME


@cache
def _process_tuner(path: Path | None, override: str | None) -> Tuner:
    from embedcache.models.shared.cpu_features import cpu_kind

    return Tuner(
        path, fingerprint=fingerprint(cpu_kind()), override=parse_override(override)
    )


def process_tuner() -> Tuner:
    """This process's tuner: cache beside ``NUMBA_CACHE_DIR``, override from
    ``EMBEDCACHE_TUNE`` (read here, as numba reads its own variable, because models
    are loaded far below the CLI)."""
    return _process_tuner(cache_path(os.environ), os.environ.get(ENV_VAR))
