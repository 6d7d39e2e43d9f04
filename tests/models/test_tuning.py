"""The kernel tuner: picks, caches, re-tunes, honours the override, drops disagreeing
candidates; the real candidates agree within tolerance and stay out of the key."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from embedcache.models.shared import attention, tuning
from embedcache.models.shared.tuning import Candidate, Problem, Tuner

FIXTURES = Path(__file__).parents[1] / "fixtures" / "caduceus"
PRINT = {"tuner": "1", "cpu_kind": "AVX2", "torch": "2.13.0"}
PROBLEM = Problem("scan", "float32", "any", "d=4")


class Counted:
    """A candidate that returns ``value`` after ``delay`` seconds, counting calls."""

    def __init__(self, name, *, delay=0.0, value=1.0):
        self.name, self.delay, self.value, self.calls = name, delay, value, 0

    def candidate(self):
        def run(_inputs):
            self.calls += 1
            time.sleep(self.delay)
            return np.full(4, self.value, dtype=np.float32)

        return Candidate(self.name, run)


def kernels(**delays):
    return {name: Counted(name, delay=d) for name, d in delays.items()}


def choose(tuner, found, problem=PROBLEM):
    return tuner.choose(problem, [k.candidate() for k in found.values()], lambda: None)


def test_picks_the_fastest_and_caches_it(tmp_path):
    path = tmp_path / "tuning.json"
    found = kernels(loop=0.004, blocked=0.0)
    assert choose(Tuner(path, fingerprint=PRINT, budget=0.05), found) == "blocked"
    stored = json.loads(path.read_text())
    assert stored["fingerprint"] == PRINT
    assert stored["choices"][PROBLEM.key()]["choice"] == "blocked"
    calls = {k.name: k.calls for k in found.values()}
    # a new process with the same fingerprint reads the choice: nothing runs
    again = Tuner(path, fingerprint=PRINT)
    assert choose(again, found) == "blocked"
    assert {k.name: k.calls for k in found.values()} == calls
    assert again.choices[PROBLEM.key()].how == "cached"


def test_a_new_candidate_is_a_reason_to_tune_again(tmp_path):
    path = tmp_path / "tuning.json"
    choose(
        Tuner(path, fingerprint=PRINT, budget=0.05), kernels(loop=0.0, blocked=0.004)
    )
    found = kernels(loop=0.004, blocked=0.004, fused=0.0)
    again = Tuner(path, fingerprint=PRINT, budget=0.05)
    assert choose(again, found) == "fused"
    assert again.choices[PROBLEM.key()].how == "timed"
    stored = json.loads(path.read_text())["choices"][PROBLEM.key()]
    assert stored["candidates"] == ["loop", "blocked", "fused"]


def test_a_choice_another_process_wrote_meanwhile_stands(tmp_path):
    path = tmp_path / "tuning.json"
    found = kernels(loop=0.004, blocked=0.0)

    def other_process_tunes(_inputs):
        # while this process times its candidates, another one writes its choice
        if not path.exists():
            other = Tuner(path, fingerprint=PRINT, override={"scan": "loop"})
            other._stored[PROBLEM.key()] = {
                "choice": "loop",
                "candidates": ["writer", "loop", "blocked"],
            }
            other._save()
        return np.full(4, 1.0, dtype=np.float32)

    tuner = Tuner(path, fingerprint=PRINT, budget=0.05)
    candidates = [Candidate("writer", other_process_tunes)] + [
        k.candidate() for k in found.values()
    ]
    # "blocked" is the fastest here, but the first choice written stands
    assert tuner.choose(PROBLEM, candidates, lambda: None) == "loop"
    assert tuner.choices[PROBLEM.key()].how == "cached"
    assert json.loads(path.read_text())["choices"][PROBLEM.key()]["choice"] == "loop"


@pytest.mark.parametrize(
    "change", [{"cpu_kind": "AMX"}, {"torch": "2.14.0"}], ids=["cpu", "library"]
)
def test_retunes_when_the_cpu_kind_or_a_library_changes(tmp_path, change):
    path = tmp_path / "tuning.json"
    assert choose(Tuner(path, fingerprint=PRINT), kernels(loop=0.004, blocked=0)) == (
        "blocked"
    )
    # on the "new machine" loop is the faster one: only a re-tune can find that
    found = kernels(loop=0.0, blocked=0.004)
    moved = Tuner(path, fingerprint={**PRINT, **change}, budget=0.05)
    assert choose(moved, found) == "loop"
    assert moved.choices[PROBLEM.key()].how == "timed"
    assert json.loads(path.read_text())["fingerprint"] == {**PRINT, **change}


def test_a_candidate_that_disagrees_is_not_eligible(tmp_path):
    found = kernels(loop=0.004)
    wrong = Counted("fast_but_wrong", value=1.001)
    tuner = Tuner(tmp_path / "t.json", fingerprint=PRINT, budget=0.05)
    name = tuner.choose(
        PROBLEM, [found["loop"].candidate(), wrong.candidate()], lambda: None
    )
    assert name == "loop"
    assert "differs" in tuner.choices[PROBLEM.key()].ineligible["fast_but_wrong"]
    # bf16's tolerance admits what fp32's does not
    loose = Tuner(None, fingerprint=PRINT)
    problem = Problem("scan", "bfloat16")
    assert (
        loose.choose(
            problem, [found["loop"].candidate(), wrong.candidate()], lambda: None
        )
        == "fast_but_wrong"
    )


def test_override_off_and_named_choices(tmp_path):
    found = kernels(loop=0.004, blocked=0.0)
    off = Tuner(
        tmp_path / "t.json", fingerprint=PRINT, override=tuning.parse_override("off")
    )
    assert choose(off, found) == "loop"
    assert sum(k.calls for k in found.values()) == 0
    assert not (tmp_path / "t.json").exists()
    forced = Tuner(
        None,
        fingerprint=PRINT,
        override=tuning.parse_override("scan=loop, attention=math"),
    )
    assert choose(forced, found) == "loop"
    assert forced.choices[PROBLEM.key()].how == "forced"
    unknown = Tuner(None, fingerprint=PRINT, override={"scan": "chunked"})
    with pytest.raises(tuning.TuningError, match=r"scan=chunked.*loop, blocked"):
        choose(unknown, found)
    with pytest.raises(tuning.TuningError, match="KERNEL=CHOICE"):
        tuning.parse_override("scan")
    assert tuning.parse_override("") == {}


def test_fingerprint_names_the_cpu_kind_and_libraries():
    got = tuning.fingerprint("AMX")
    assert got["cpu_kind"] == "AMX"
    assert (
        got["torch"] == torch.__version__.split("+")[0]
        or got["torch"] == torch.__version__
    )
    assert {"numba", "llvmlite", "numpy", "embedcache"} <= set(got)


@pytest.mark.parametrize("additive", [False, True], ids=["bool-mask", "alibi-bias"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_candidates_agree_within_tolerance(dtype, additive):
    args = attention.synthetic_inputs(attention.Shape(2, 33, 8, dtype, "cpu", additive))
    want = attention.attend_flash(*args).float()
    got = attention.attend_math(*args).float()
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() / scale <= tuning.TOLERANCE[str(dtype)[6:]]


def test_tuned_attention_is_used_and_recorded(tmp_path):
    tuner = Tuner(tmp_path / "t.json", fingerprint=PRINT, repeats=1, budget=0.01)
    q, k, v, keys = attention.synthetic_inputs(
        attention.Shape(2, 20, 8, torch.float32, "cpu")
    )
    out = attention.attend(q, k, v, keys, tuner=tuner)
    (key,) = tuner.choices
    assert key.startswith("attention|float32|<=32|heads=2,head_dim=8")
    chosen = attention.CANDIDATES[tuner.choices[key].name]
    torch.testing.assert_close(out, chosen(q, k, v, keys), rtol=0, atol=0)


def test_the_scan_choice_stays_out_of_the_key(monkeypatch, tmp_path):
    # every scan candidate computes the loop kernel's bits, so a forced choice
    # gives the same key and the same vectors
    from embedcache.models.families.caduceus.adapter import load_caduceus_adapter

    monkeypatch.setattr(tuning, "cache_path", lambda _environ: tmp_path / "t.json")
    seqs = ["ACGTTGCAAC" * 7, "GGGCCCATAT" * 5]
    runs = {}
    for name in ("loop", "blocked"):
        monkeypatch.setenv(tuning.ENV_VAR, f"scan={name}")
        adapter = load_caduceus_adapter(FIXTURES / "ph", rc_mode="average")
        assert tuning.process_tuner().choices
        runs[name] = (adapter.key, adapter.embed_batch(seqs))
    assert runs["loop"][0] == runs["blocked"][0]
    np.testing.assert_array_equal(runs["loop"][1], runs["blocked"][1])


FAMILIES = Path(__file__).parents[1] / "fixtures"


@pytest.mark.parametrize(
    ("folder", "kernels"),
    [
        ("ntv2/ntv2", {"attention", "linear"}),
        ("dnabert2/dnabert2", {"attention", "linear"}),
        ("gena/gena_base", {"attention", "linear"}),
    ],
    ids=["ntv2", "dnabert2", "gena"],
)
@pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="torch built without mkldnn"
)
def test_encoder_kernels_are_tuned_and_stay_out_of_the_key(
    monkeypatch, tmp_path, folder, kernels
):
    from embedcache.models import load_adapter

    monkeypatch.setattr(tuning, "cache_path", lambda _environ: tmp_path / "t.json")
    seqs = ["ACGTTGCAACGGT" * 5, "GGGCCCATATAC" * 3]
    runs = {}
    for forced in ("attention=flash,linear=aten", "attention=math,linear=onednn"):
        monkeypatch.setenv(tuning.ENV_VAR, forced)
        adapter = load_adapter(str(FAMILIES / folder), device="cpu")
        vectors = adapter.embed_batch(seqs)
        chosen = tuning.process_tuner().choices
        assert {key.split("|")[0] for key in chosen} == kernels
        assert all(c.how == "forced" for c in chosen.values())
        runs[forced] = (adapter.key, vectors)
    (key_a, a), (key_b, b) = runs.values()
    assert key_a == key_b
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * np.abs(a).max())
