from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from embedcache.analysis.layers import choose_layer, layer_sweeps, sweep_groups
from embedcache.specs import ModelKey
from tests.evaluations import DictStore, draw_tiny


def _key(layer, model_id="org/m"):
    return ModelKey(
        model_id=model_id,
        revision="b" * 40,
        adapter="hf-encoder",
        adapter_version="1",
        layer=layer,
    )


def test_sweep_groups_keys_differing_only_in_layer():
    keys = [_key(2), _key(-1), _key(0), _key(-1, "org/single"), _key(3, "org/x")]
    groups = sweep_groups(keys)
    assert list(groups) == [_key(-1)]
    assert [k.layer for k in groups[_key(-1)]] == [-1, 0, 2]


def test_choose_layer_by_lowest_loss_ties_to_the_last():
    assert choose_layer({-1: 0.5, 0: 0.6, 2: 0.4}) == 2
    assert choose_layer({-1: 0.4, 0: 0.6, 2: 0.4}) == -1
    assert choose_layer({0: 0.4, 2: 0.4}) == 0


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """Layer 2 separates the labels well in train but is reversed on test; layer 0
    separates them weakly in train and well in test. The CV inside train must pick
    2, whatever test accuracy says."""
    subset = draw_tiny(tmp_path_factory.mktemp("versions"))
    items = subset.items
    y = 2 * items["label"].to_numpy() - 1
    is_train = (items["split"] == "train").to_numpy()
    rng = np.random.default_rng(0)
    store = DictStore()
    for layer in (-1, 0, 1, 2):
        x = rng.normal(size=(items.height, 6)).astype(np.float32)
        if layer == 2:
            x[:, 0] += 2.0 * y * np.where(is_train, 1, -1)
        if layer == 0:
            x[:, 0] += y * np.where(is_train, 0.6, 2.0)
        store.put(_key(layer), items["seq_sha256"].to_list(), x)
    return subset, store


def test_cv_chosen_layer_is_the_informative_one_never_the_test_best(planted):
    subset, store = planted
    sweeps = layer_sweeps(subset, store, n_boot=100)
    frame = sweeps.frame
    assert set(frame["layer"]) == {-1, 0, 1, 2}
    chosen = sweeps.chosen()
    assert set(chosen["layer"]) == {2}  # every dataset and the mean
    mean = frame.filter(pl.col("dataset") == "mean")
    acc = dict(zip(mean["layer"], mean["accuracy"], strict=True))
    assert acc[2] < 0.2  # reversed on test: the worst test accuracy ...
    assert acc[0] > 0.8  # ... and the best one is not chosen
    loss = dict(zip(mean["layer"], mean["cv_log_loss"], strict=True))
    assert loss[2] == min(loss.values())
    assert frame["n"].to_list()[0] > 0


def test_last_layer_numbers_equal_the_board(planted):
    from embedcache.analysis.evaluation import evaluate

    subset, store = planted
    sweeps = layer_sweeps(subset, store, n_boot=100, seed=1)
    board = evaluate(subset, store, n_boot=100, seed=1).results
    last = sweeps.frame.filter(pl.col("layer") == -1).sort("dataset")
    want = board.filter(
        (pl.col("metric") == "accuracy") & (pl.col("model") == "org/m")
    ).sort("dataset")
    assert last["accuracy"].to_list() == want["value"].to_list()
    assert last["ci_low"].to_list() == want["ci_low"].to_list()


def test_layers_flag_parses_all_and_lists():
    from embedcache.errors import AdapterOptionError
    from embedcache.models.registry import parse_layers

    def args(layers, layer=-1, model="caduceus-tiny"):
        return {"spec": layers, "layer": layer, "model": model, "revision": None}

    def _layers(given):
        return parse_layers(given.pop("spec"), **given)

    assert _layers(args(None, layer=3)) == (3,)
    assert _layers(args("2,6,12")) == (2, 6, 12)
    assert _layers(args("all")) == (-1, 0, 1, 2)  # caduceus-tiny has 3 blocks
    with pytest.raises(AdapterOptionError, match="not both"):
        _layers(args("all", layer=2))
    with pytest.raises(AdapterOptionError, match="comma list"):
        _layers(args("2,x"))
    with pytest.raises(AdapterOptionError, match="without layers"):
        _layers(args("all", model="kmer-2"))
