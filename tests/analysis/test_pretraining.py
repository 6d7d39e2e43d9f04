from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from embedcache.analysis.bootstrap import percentile_ci
from embedcache.analysis.pretraining import find_twins, pretraining_gain
from embedcache.analysis.selection import ModelEntry, _names, select_models
from embedcache.specs import ModelKey
from tests.evaluations import make_evaluation


def _key(revision, options=(), layer=-1, model_id="org/m"):
    return ModelKey(
        model_id=model_id,
        revision=revision,
        adapter="caduceus",
        adapter_version="1",
        layer=layer,
        options=options,
    )


TRAINED = _key("a" * 40)
TWIN = _key("random-init:0", options=(("config", "sha256:" + "1" * 64),))
OTHER_TWIN = _key("random-init:0", model_id="org/other")


def test_twins_are_controls_named_by_seed_and_layers_stay_off_the_board():
    keys = [TRAINED, TWIN, OTHER_TWIN, _key("a" * 40, layer=2)]
    ranked, floors, _ = select_models(keys)
    assert [e.key for e in ranked] == [TRAINED]
    names = {e.name: e.is_floor for e in floors if e.key is not None}
    assert names == {
        "org/m (random init 0, control)": True,
        "org/other (random init 0, control)": True,
    }
    assert all(e.key.layer == -1 for e in ranked + floors if e.key is not None)
    assert _names([TWIN]) == ["org/m (random init 0, control)"]


def test_find_twins_pairs_on_everything_but_revision_and_config():
    entries = [
        ModelEntry("org/m", TRAINED, False),
        ModelEntry("twin", TWIN, True),
        ModelEntry("other twin", OTHER_TWIN, True),
        ModelEntry("majority", None, True),
    ]
    pairs = find_twins(entries)
    assert [(t.name if t else None, w.name) for t, w in pairs] == [
        ("org/m", "twin"),
        (None, "other twin"),
    ]
    # a different rc mode is another embedding: not the twin's trained model
    rc = ModelEntry("org/m rc", dataclasses.replace(TRAINED, rc_mode="average"), False)
    assert find_twins([rc, entries[1]])[0][0] is None


def _evaluation():
    # d: 100 items; trained right on 90, twin on 60 (a gain of 0.3)
    y = np.tile([0, 1], 50)
    trained = np.where(np.arange(100) < 90, y, 1 - y)
    twin = np.where(np.arange(100) < 60, y, 1 - y)
    evaluation = make_evaluation(
        {"d": y.tolist()},
        {"d": [trained.tolist(), twin.tolist()]},
        ["org/m"],
        ("twin",),
    )
    return dataclasses.replace(
        evaluation,
        ranked=(ModelEntry("org/m", TRAINED, False),),
        floors=(ModelEntry("twin", TWIN, True),),
    )


def test_gain_is_paired_difference_on_the_same_resamples():
    evaluation = _evaluation()
    gain = pretraining_gain(evaluation)
    mean = gain.filter(gain["dataset"] == "mean").row(0, named=True)
    assert (mean["model"], mean["twin"], mean["seed"]) == ("org/m", "twin", "0")
    assert mean["accuracy"] == pytest.approx(0.9)
    assert mean["twin_accuracy"] == pytest.approx(0.6)
    assert mean["gain"] == pytest.approx(0.3)
    samples = evaluation.bootstrap.samples("accuracy")
    low, high = percentile_ci(samples[:, 0] - samples[:, 1])
    assert (mean["ci_low"], mean["ci_high"]) == (low, high)
    assert 0 < mean["ci_low"] < 0.3 < mean["ci_high"]


def test_a_twin_alone_is_shown_without_gain():
    evaluation = _evaluation()
    alone = dataclasses.replace(evaluation, ranked=(), floors=evaluation.floors)
    # the bootstrap still holds both rows; only the twin is an entry now
    gain = pretraining_gain(alone)
    assert gain["model"].null_count() == gain.height
    assert gain["gain"].null_count() == gain.height
    assert gain["twin_accuracy"].to_list()[0] == pytest.approx(0.6)
