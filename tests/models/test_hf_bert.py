"""The hf family's own BERT path: the same hidden states and tokens as transformers.

A plain ``model_type: bert`` checkpoint with a plain ``tokenizer.json`` loads without
transformers (``families.bert`` + ``tokenizers``); these tests compare it with
transformers' ``BertModel`` and ``AutoTokenizer`` on checkpoints saved by them.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from embedcache import errors
from embedcache.models import load_adapter
from embedcache.models.families.bert.adapter import native_tokenizer
from embedcache.models.families.bert.network import (
    BertNetwork,
    arch_from_config,
    encoder_state,
    native_config,
)
from embedcache.models.families.hf.adapter import kmer_split
from embedcache.models.families.hf.network import HFNetwork
from embedcache.models.shared.checkpoint import empty_module
from embedcache.models.shared.weights import load_strict, read_state_dict
from tests.conftest import make_dna_tokenizer, make_kmer3_tokenizer

# (hidden, heads, layers, intermediate, type vocab, layer-norm eps, class saved)
CONFIGS = {
    "base": {"hidden": 16, "heads": 2, "layers": 2, "inter": 32, "types": 2,
             "eps": 1e-12, "cls_name": "BertModel"},
    "wide-masked-lm": {"hidden": 32, "heads": 4, "layers": 3, "inter": 48, "types": 1,
                       "eps": 1e-5, "cls_name": "BertForMaskedLM"},
}  # fmt: skip


def save_bert(path, *, hidden, heads, layers, inter, types, eps, cls_name):
    import transformers

    config = transformers.BertConfig(
        vocab_size=12,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_hidden_layers=layers,
        intermediate_size=inter,
        type_vocab_size=types,
        layer_norm_eps=eps,
        max_position_embeddings=40,
    )
    torch.manual_seed(0)
    model = getattr(transformers, cls_name)(config).eval()
    with torch.no_grad():  # move LayerNorms and biases off their 1 / 0 init
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module", params=list(CONFIGS))
def bert_dir(request, tmp_path_factory):
    return save_bert(tmp_path_factory.mktemp(request.param), **CONFIGS[request.param])


def native_network(folder):
    config = json.loads((folder / "config.json").read_text())
    arch = arch_from_config(config, where="test")
    network = empty_module(lambda: BertNetwork(arch))
    load_strict(
        network, encoder_state(read_state_dict(folder)), where="test", family="BERT"
    )
    return network.eval()


def test_every_hidden_state_equals_bert_model(bert_dir):
    from transformers import BertModel

    theirs = BertModel.from_pretrained(bert_dir, add_pooling_layer=False).eval()
    ours = native_network(bert_dir)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 12, (4, 23), generator=generator)
    mask = torch.ones_like(ids, dtype=torch.bool)
    for row, length in enumerate([23, 17, 5, 1]):  # right padding, as the engine
        mask[row, length:] = False
    n_layers = theirs.config.num_hidden_layers
    layers = [*range(n_layers + 1), -1]
    with torch.no_grad():
        want = theirs(
            input_ids=ids, attention_mask=mask.long(), output_hidden_states=True
        )
        got = ours(ids, mask, layers)
    expected = [*want.hidden_states, want.last_hidden_state]
    for layer, mine, reference in zip(layers, got, expected, strict=True):
        np.testing.assert_allclose(
            mine[mask].numpy(),
            reference[mask].numpy(),
            atol=1e-5,
            rtol=0,
            err_msg=f"layer {layer}",
        )


def test_a_wrong_layer_norm_eps_is_seen(bert_dir):
    # the comparison can fail: another eps moves the states beyond the tolerance
    from transformers import BertModel

    theirs = BertModel.from_pretrained(bert_dir, add_pooling_layer=False).eval()
    config = json.loads((bert_dir / "config.json").read_text())
    arch = arch_from_config({**config, "layer_norm_eps": 0.5}, where="test")
    ours = empty_module(lambda: BertNetwork(arch))
    load_strict(
        ours, encoder_state(read_state_dict(bert_dir)), where="t", family="BERT"
    )
    ids = torch.arange(10)[None] % 12
    mask = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        want = theirs(input_ids=ids).last_hidden_state
        got = ours.eval()(ids, mask, [-1])[0]
    assert (got - want).abs().max() > 1e-3


def test_variants_go_through_transformers(tiny_bert_dir, tmp_path):
    config = json.loads((tiny_bert_dir / "config.json").read_text())
    assert native_config(config)
    for field, value in [
        ("hidden_act", "relu"),
        ("position_embedding_type", "relative_key"),
        ("is_decoder", True),
        ("model_type", "roberta"),
    ]:
        assert not native_config({**config, field: value})
    with pytest.raises(errors.CheckpointError, match="not a plain BERT"):
        arch_from_config({**config, "hidden_act": "relu"}, where="test")
    copy = tmp_path / "relu"
    shutil.copytree(tiny_bert_dir, copy)
    (copy / "config.json").write_text(json.dumps({**config, "hidden_act": "relu"}))
    assert isinstance(load_adapter(str(copy), device="cpu").network, HFNetwork)
    native = load_adapter(str(tiny_bert_dir), device="cpu")
    assert isinstance(native.network, BertNetwork)
    # the random-init twin keeps transformers' own init, so its vectors do not move
    twin = load_adapter(str(tiny_bert_dir), device="cpu", random_init=1)
    assert isinstance(twin.network, HFNetwork)


# --- tokenizers ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer_dirs(tmp_path_factory, tiny_bert_dir):
    """tokenizer.json folders as transformers saves them: per base, 3-mer words."""
    root = tmp_path_factory.mktemp("tokenizers")
    make_dna_tokenizer(style="esm", model_max_length=30).save_pretrained(root / "esm")
    tokenizer, vocab = make_kmer3_tokenizer()
    tokenizer.save_pretrained(root / "kmer")
    # as transformers 4 saved it: the class's old name and the specials listed by id
    shutil.copytree(root / "kmer", root / "v4")
    config = json.loads((root / "v4" / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["added_tokens_decoder"] = {
        str(i): {"content": t, "special": True} for t, i in vocab.items() if i < 5
    }
    (root / "v4" / "tokenizer_config.json").write_text(json.dumps(config))
    return {
        "char": (tiny_bert_dir, None),
        "esm": (root / "esm", None),
        "kmer": (root / "kmer", 3),
        "v4": (root / "v4", 3),
    }


def assert_same_tokens(folder, kmer, seqs):
    from transformers import AutoTokenizer

    ours, _, _ = native_tokenizer(folder, kmer=kmer)
    theirs = AutoTokenizer.from_pretrained(folder)
    texts = [kmer_split(s, kmer) if kmer else s for s in seqs]
    enc = theirs(texts, add_special_tokens=True, return_special_tokens_mask=True)
    want = [
        (list(ids), [bool(x) for x in special])
        for ids, special in zip(
            enc["input_ids"], enc["special_tokens_mask"], strict=True
        )
    ]
    got = [(list(e.ids), list(e.special)) for e in ours.encode_many(seqs)]
    assert got == want
    assert ours.pad_id == theirs.pad_token_id


@pytest.mark.parametrize("name", ["char", "esm", "kmer", "v4"])
@settings(max_examples=60, deadline=None)
@given(seqs=st.lists(st.text(alphabet="ACGTNRY", max_size=50), min_size=1, max_size=4))
def test_tokens_equal_auto_tokenizer(tokenizer_dirs, name, seqs):
    folder, kmer = tokenizer_dirs[name]
    assert_same_tokens(folder, kmer, seqs)


def test_limits_and_declined_tokenizers(tokenizer_dirs, tmp_path):
    folder, _ = tokenizer_dirs["esm"]
    _, named, limit = native_tokenizer(folder, kmer=None)
    assert limit == 30
    assert named["cls_token"] == "<cls>"
    # a class that builds its own pipeline, or a config adding a token, is left to
    # transformers
    copy = tmp_path / "other"
    shutil.copytree(folder, copy)
    config = json.loads((copy / "tokenizer_config.json").read_text())
    (copy / "tokenizer_config.json").write_text(
        json.dumps({**config, "tokenizer_class": "BertTokenizer"})
    )
    assert native_tokenizer(copy, kmer=None) is None
    unnamed = {k: v for k, v in config.items() if k != "tokenizer_class"}
    (copy / "tokenizer_config.json").write_text(json.dumps(unnamed))
    assert native_tokenizer(copy, kmer=None) is None  # AutoTokenizer picks by model
    added = {"99": {"content": "<new>", "special": True}}
    (copy / "tokenizer_config.json").write_text(
        json.dumps({**config, "added_tokens_decoder": added})
    )
    assert native_tokenizer(copy, kmer=None) is None
    (copy / "tokenizer.json").unlink()
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    assert native_tokenizer(copy, kmer=None) is None
