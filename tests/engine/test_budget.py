"""The token budget as a tuner problem: timed once per machine and model shape,
the adapter's own budget the reference, its candidates equal to the bit, skipped
where a budget is given, nothing is computed or the adapter is a floor."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embedcache.engine import budget
from embedcache.engine.budget import (
    budget_candidates,
    choose_token_budget,
    synthetic_sequences,
    tuned_batch_rule,
)
from embedcache.engine.local import embed_sequences
from embedcache.errors import InvalidSequenceError
from embedcache.models import load_adapter
from embedcache.models.floors.kmer import KmerAdapter
from embedcache.models.shared.tuning import Problem, Tuner, TuningError
from tests.engine.helpers import MemoryStore, random_seqs

HYENA_TINY = Path(__file__).parents[1] / "fixtures" / "hyena" / "tiny"
CADUCEUS_PH = Path(__file__).parents[1] / "fixtures" / "caduceus" / "ph"
PRINT = {"tuner": "1", "cpu_kind": "test"}


@pytest.fixture(scope="module")
def hyena():
    return load_adapter(str(HYENA_TINY), device="cpu", dtype="float32")


def test_candidates_are_the_adapters_budget_then_half_and_twice():
    assert budget_candidates(1536) == (1536, 768, 3072)
    assert budget_candidates(1) == (1, 2)  # half of 1 is 1: not twice


def test_synthetic_sequences_fit_the_context(hyena):
    seqs = synthetic_sequences(hyena, 3)
    assert len(seqs) == 3
    assert len(set(seqs)) == 3
    # the tiny HyenaDNA's context is 330 tokens: 500 bases do not fit, 250 do
    assert {len(s) for s in seqs} == {budget.TUNING_BASES // 2}
    assert hyena.n_tokens(seqs[0]) <= hyena.max_tokens
    assert set("".join(seqs)) == set("ACGT")


class ShortContext:
    """An adapter of a 100-token context, one token per base, that refuses to embed
    (as a model might refuse a synthetic input)."""

    max_tokens = 100
    dim = 4
    needs_equal_lengths = False
    preferred_token_budget = 1000
    tuning_shape = "stub"
    key = type("Key", (), {"dtype": "float32", "short": lambda self: "stub"})()

    def n_tokens(self, seq):
        return len(seq)

    def embed_batch(self, seqs):
        msg = f"{len(seqs)} sequences refused"
        raise InvalidSequenceError(msg)


def test_synthetic_sequences_halve_to_fit_a_short_context():
    seqs = synthetic_sequences(ShortContext(), 5)
    assert {len(s) for s in seqs} == {budget.TUNING_BASES // 8}  # 500 -> 62 bases


def test_a_model_that_refuses_the_synthetic_input_keeps_its_budget(caplog):
    tuner = Tuner(None, fingerprint=PRINT)
    with caplog.at_level("WARNING", logger="embedcache.engine.budget"):
        rule = tuned_batch_rule(ShortContext(), tuner=tuner)
    assert rule.token_budget == ShortContext.preferred_token_budget
    assert "not tuned" in caplog.text
    assert "refused" in caplog.text


@pytest.mark.parametrize(
    ("folder", "dtype"),
    [(HYENA_TINY, "float32"), (HYENA_TINY, "bfloat16"), (CADUCEUS_PH, "float32")],
)
def test_the_choice_is_timed_once_then_cached_and_the_candidates_agree(
    tmp_path, folder, dtype
):
    adapter = load_adapter(str(folder), device="cpu", dtype=dtype)
    path = tmp_path / "tuning.json"
    tuner = Tuner(path, fingerprint=PRINT)
    chosen = choose_token_budget(adapter, tuner=tuner)
    candidates = budget_candidates(adapter.preferred_token_budget)
    names = [str(b) for b in candidates]
    assert chosen in candidates
    ((key, choice),) = tuner.choices.items()
    assert key.startswith(f"budget|{dtype}|")
    assert key.endswith(adapter.tuning_shape)
    assert choice.how == "timed"
    assert set(choice.seconds) == set(names)
    # batch invariance: no candidate's vectors differ from the reference's
    assert choice.ineligible == {}
    problem = Problem(*key.split("|", 3))
    assert Tuner(None, fingerprint=PRINT).will_time(problem, names)
    again = Tuner(path, fingerprint=PRINT)
    assert not again.will_time(problem, names)
    assert choose_token_budget(adapter, tuner=again) == chosen
    assert again.choices[key].how == "cached"


def test_the_override_forces_a_candidate_and_names_them_when_it_is_not_one(hyena):
    preferred = hyena.preferred_token_budget
    forced = Tuner(None, fingerprint=PRINT, override={"budget": str(preferred // 2)})
    assert tuned_batch_rule(hyena, tuner=forced).token_budget == preferred // 2
    wrong = Tuner(None, fingerprint=PRINT, override={"budget": "7"})
    with pytest.raises(TuningError, match=str(preferred * 2)):
        tuned_batch_rule(hyena, tuner=wrong)
    off = Tuner(None, fingerprint=PRINT, override=None)
    assert tuned_batch_rule(hyena, tuner=off).token_budget == preferred


def test_a_given_budget_and_a_floor_are_not_tuned(hyena):
    tuner = Tuner(None, fingerprint=PRINT)
    assert tuned_batch_rule(hyena, 999, tuner=tuner).token_budget == 999
    floor = KmerAdapter(k=3)
    assert tuned_batch_rule(floor, tuner=tuner).token_budget == (
        floor.preferred_token_budget
    )
    assert tuner.choices == {}


def test_embed_tunes_only_when_something_is_computed(hyena, monkeypatch):
    calls = []

    def counted(adapter, *, tuner=None):
        calls.append(adapter.key.short())
        return adapter.preferred_token_budget

    monkeypatch.setattr(budget, "choose_token_budget", counted)
    store = MemoryStore()
    seqs = random_seqs(4, seed=3, low=50, high=120)
    first = embed_sequences(hyena, seqs, store)
    assert len(calls) == 1
    assert first.n_computed == 4
    again = embed_sequences(hyena, seqs, store)
    assert len(calls) == 1
    assert again.n_computed == 0
    assert np.array_equal(first.vectors, again.vectors)
