"""esm_tokens: the same ids and special flags as transformers' EsmTokenizer.

The NT-v2 fixtures' two vocabularies: the published 6-mer one and a 3-mer one that
lacks a 3-mer (so greedy matching falls back to single bases mid-run).
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embedcache import errors
from embedcache.models.shared.esm_tokens import read_vocab_tokenizer

DATA = Path(__file__).parents[1] / "fixtures" / "ntv2"
VARIANTS = ("ntv2", "ntv2_3mer_bias")
# pieces DNA input (and some that should never reach us) is made of
PIECES = [
    *"ACGTN",
    *"acgtn",
    *"RYX",
    " ",
    "\t",
    "ACGTAC",
    "GGGGGG",
    "<cls>",
    "<eos>",
    "<unk>",
    "<mask>",
    "<pad>",
    "<bos>",
    "<cl",
    ">",
]


@functools.cache
def official(variant: str):
    from transformers import EsmTokenizer

    return EsmTokenizer.from_pretrained(DATA / variant)


@functools.cache
def ours(variant: str):
    return read_vocab_tokenizer(DATA / variant, where="test")


def official_encoding(variant: str, seqs: list[str]) -> list[tuple[list, list]]:
    tokenizer = official(variant)
    special = set(tokenizer.all_special_ids)
    rows = tokenizer(seqs, add_special_tokens=True)["input_ids"]
    return [(row, [i in special for i in row]) for row in rows]


def assert_same(variant: str, seqs: list[str]) -> None:
    got = [(list(e.ids), list(e.special)) for e in ours(variant).encode_many(seqs)]
    assert got == official_encoding(variant, seqs)


@pytest.mark.parametrize("variant", VARIANTS)
@settings(max_examples=150, deadline=None)
@given(seqs=st.lists(st.text(alphabet="ACGTN", max_size=60), min_size=1, max_size=4))
def test_dna_matches_esm_tokenizer(variant, seqs):
    assert_same(variant, seqs)


@pytest.mark.parametrize("variant", VARIANTS)
@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=30))
def test_odd_input_matches_esm_tokenizer(variant, pieces):
    assert_same(variant, ["".join(pieces)])


@pytest.mark.parametrize("variant", VARIANTS)
def test_long_and_edge_sequences_match(variant):
    seqs = [
        "",
        "ACGTA" * 100,  # 500 bp: 83 six-mers and 2 single bases
        "ACGT" * 62 + "ACG",
        "N" * 7,
        "acgtacgt",  # lower case is one <unk> (the adapter upper-cases first)
        "ACGTRYACGTAC",
        "  ACGTAC  ",
    ]
    assert_same(variant, seqs)


def test_published_vocab_limits_and_specials():
    tokenizer = ours("ntv2")
    assert len(tokenizer) == len(official("ntv2")) == 4107
    assert tokenizer.max_tokens == official("ntv2").model_max_length == 2048
    assert tokenizer.special_ids == set(official("ntv2").all_special_ids)
    assert tokenizer.pad_id == official("ntv2").pad_token_id
    assert tokenizer.eos_id is None  # NT-v2's eos_token is null: nothing appended


def test_eos_token_set_is_appended(tmp_path):
    folder = tmp_path / "eos"
    shutil.copytree(DATA / "ntv2_3mer_bias", folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["eos_token"]  # EsmTokenizer's default <eos> then applies
    del config["model_max_length"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    from transformers import EsmTokenizer

    theirs = EsmTokenizer.from_pretrained(folder)
    mine = read_vocab_tokenizer(folder, where="test")
    for seq in ["ACGTACGTA", "", "NNACG"]:
        encoded = mine.encode(seq)
        assert list(encoded.ids) == theirs(seq)["input_ids"]
        assert encoded.ids[-1] == theirs.eos_token_id
        assert encoded.special[-1]
    assert mine.max_tokens is None


def test_disagreeing_files_and_missing_specials_are_refused(tmp_path):
    folder = tmp_path / "bad"
    shutil.copytree(DATA / "ntv2", folder)
    (folder / "special_tokens_map.json").write_text(json.dumps({"cls_token": "<bos>"}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"cls_token": "<cls>"}))
    with pytest.raises(errors.CheckpointError, match="make them agree"):
        read_vocab_tokenizer(folder, where="test")
    (folder / "tokenizer_config.json").write_text(json.dumps({"mask_token": "<M>"}))
    with pytest.raises(errors.CheckpointError, match=r"\['<M>'\] are not in vocab"):
        read_vocab_tokenizer(folder, where="test")
    (folder / "vocab.txt").unlink()
    with pytest.raises(errors.CheckpointError, match=r"no vocab\.txt"):
        read_vocab_tokenizer(folder, where="test")
