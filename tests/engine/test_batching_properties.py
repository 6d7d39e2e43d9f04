"""Property tests of the batch planner: every index exactly once, budgets held,
one sequence always runs, equal lengths kept together when the model needs it."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embedcache.engine.batching import BatchRule, plan_batches

rules = st.builds(
    BatchRule,
    token_budget=st.integers(1, 4096),
    equal_lengths=st.booleans(),
    attention_maps=st.integers(0, 16),
    score_budget=st.integers(1, 2**22),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n_tokens=st.lists(st.integers(1, 3000), max_size=80), rule=rules)
def test_batches_cover_every_index_once_within_the_budgets(n_tokens, rule):
    batches = plan_batches(n_tokens, rule)
    flat = [i for batch in batches for i in batch]
    assert sorted(flat) == list(range(len(n_tokens)))  # each exactly once
    for batch in batches:
        assert batch  # no empty batch
        longest = max(n_tokens[i] for i in batch)
        if len(batch) > 1:  # a lone sequence runs whatever its size
            assert len(batch) * longest <= rule.token_budget
            assert len(batch) * rule.attention_maps * longest**2 <= rule.score_budget
        if rule.equal_lengths:
            assert len({n_tokens[i] for i in batch}) == 1
    # batches go by length: none holds a sequence shorter than the previous batch's
    lengths = [sorted(n_tokens[i] for i in batch) for batch in batches]
    for before, after in itertools.pairwise(lengths):
        assert before[-1] <= after[0]


@settings(max_examples=100, deadline=None)
@given(length=st.integers(2, 10_000), rule=rules)
def test_one_sequence_always_runs_even_over_every_budget(length, rule):
    assert plan_batches([length], rule) == [[0]]
    over = rule.token_budget + length
    assert plan_batches([over, over], rule) in ([[0, 1]], [[0], [1]])
