from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embedcache.engine.batching import BatchRule, plan_batches


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 50), max_size=60),
    budget=st.integers(1, 300),
    equal=st.booleans(),
    maps=st.integers(0, 4),
    scores=st.integers(1, 20_000),
)
def test_plan_batches_covers_each_item_once_within_budget(
    lengths, budget, equal, maps, scores
):
    rule = BatchRule(budget, equal, attention_maps=maps, score_budget=scores)
    batches = plan_batches(lengths, rule)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    for batch in batches:
        longest = max(lengths[i] for i in batch)
        assert len(batch) == 1 or longest * len(batch) <= budget
        assert len(batch) == 1 or len(batch) * maps * longest**2 <= scores
        if equal:
            assert len({lengths[i] for i in batch}) == 1


def test_plan_batches_groups_by_length():
    lengths = [10, 3, 10, 3, 7]
    assert plan_batches(lengths, BatchRule(20)) == [[1, 3], [4, 0], [2]]
    assert plan_batches(lengths, BatchRule(100, equal_lengths=True)) == [
        [1, 3],
        [4],
        [0, 2],
    ]
    assert plan_batches(lengths, BatchRule(100)) == [[1, 3, 4, 0, 2]]


def test_attention_scores_shrink_batches_of_long_sequences():
    # the same token budget: short sequences fill it, long ones stop at the score
    # budget (3 x 2 maps x 10^2 = 600), and one sequence runs whatever its length
    rule = BatchRule(1000, attention_maps=2, score_budget=600)
    assert [len(b) for b in plan_batches([5] * 30, rule)] == [12, 12, 6]
    assert [len(b) for b in plan_batches([10] * 7, rule)] == [3, 3, 1]
    assert plan_batches([100, 100], rule) == [[0], [1]]


def test_a_budget_below_one_token_is_refused():
    with pytest.raises(ValueError, match="token budget must be positive"):
        BatchRule(0)
