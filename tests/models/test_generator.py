"""GENERator adapter: tokenizer, equality with transformers' Llama, loading, options.

tests/fixtures/generator/ (see scripts/make_generator_fixtures.py): the published small
files of GenerTeam/GENERator-eukaryote-{1.2b,3b}-base, rebuilt byte for byte against
publicly recorded sha256 digests; a tiny Llama in the published layout; pooled vectors
computed by transformers 4.44 on a public copy of the repository tokenizer's ids.
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from embedcache import errors
from embedcache.hashing import reverse_complement
from embedcache.models import load_adapter, read_config, recognise_family
from embedcache.models.families.generator import adapter as gen
from tests.models import adapter_contract as contract
from tests.models.adapter_contract import fixture_sequences as normalised_sequences

FIXTURES = Path(__file__).parents[1] / "fixtures" / "generator"
TINY = FIXTURES / "tiny"
PUBLISHED = FIXTURES / "published"
REPO = Path(__file__).parents[2]
TOKENIZER_FILES = ("vocab.txt", "special_tokens_map.json", "tokenizer_config.json")


fixture_sequences = partial(contract.raw_sequences, FIXTURES)
upper_sequences = partial(normalised_sequences, FIXTURES)


expected = contract.expected_fixture(FIXTURES)


@pytest.fixture(scope="module")
def adapters() -> dict[tuple[str, str], object]:
    return {
        (remainder, rc): load_adapter(
            str(TINY),
            device="cpu",
            rc_mode=rc,
            family_options=(("remainder", remainder),),
        )
        for remainder in gen.REMAINDERS
        for rc in ("none", "average")
    }


def copy_model(dest: Path) -> Path:
    shutil.copytree(TINY, dest)
    return dest


# -- the tokenizer -------------------------------------------------------------------


def test_vocabulary_order_is_the_published_one():
    lines = (PUBLISHED / "vocab.txt").read_text().splitlines()
    kmers = gen.kmer_vocabulary()
    assert len(lines) == gen.VOCAB_SIZE == 4128
    assert [line.split(" ")[0] for line in lines[32:]] == kmers
    assert [int(line.split(" ")[1]) for line in lines] == list(range(4128))
    assert lines[:5] == ["<oov> 0", "<s> 1", "</s> 2", "<pad> 3", "<mask> 4"]
    tok = gen.KmerTokenizer()
    assert tok.token_ids("AAAAAA") == [1, 32]
    assert tok.token_ids("TTTTTT") == [1, 1397]
    assert tok.token_ids("GGGGGG") == [1, 4127]
    assert tok.token_ids("ATCGAT") == [1, 32 + kmers.index("ATCGAT")]


def test_ids_equal_the_official_tokenizer():
    official = json.loads((FIXTURES / "token_ids.json").read_text())
    assert len(official) > 300
    tok = gen.KmerTokenizer()
    for seq, ids in official.items():
        assert tok.token_ids(seq) == ids, seq


def test_ids_recorded_from_the_hub_tokenizer():
    # a public GENEB audit records the hub tokenizer (revision 5e872c94) on
    # "<s>" + sequence with BOS added: [1, 1, ...]; without the literal "<s>":
    tok = gen.KmerTokenizer()
    assert tok.token_ids("ACGTNACGTNAC") == [1, 0, 0]
    assert tok.token_ids("AAAAAATTTTTT") == [1, 32, 1397]


def test_remainder_policies():
    oov, trim = gen.KmerTokenizer(), gen.KmerTokenizer(remainder="trim")
    seq = "AAAAAATTTTTTGG"  # 14 bp: two 6-mers and a 2-base tail
    assert oov.token_ids(seq) == [1, 32, 1397, 0]
    assert trim.token_ids(seq) == [1, 32, 1397]
    assert oov.token_ids("acgtac") == oov.token_ids("ACGTAC")  # upper-cased
    encoded = oov.encode(seq)
    assert encoded.special == (True, False, False, False)  # only BOS is special
    with pytest.raises(errors.AdapterOptionError, match="remainder"):
        gen.KmerTokenizer(remainder="pad")


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="ACGTN", max_size=80))
def test_token_count_law(seq):
    oov = gen.KmerTokenizer().token_ids(seq)
    trim = gen.KmerTokenizer(remainder="trim").token_ids(seq)
    assert len(oov) == 1 + math.ceil(len(seq) / 6)
    assert len(trim) == 1 + len(seq) // 6
    assert oov[: len(trim)] == trim
    for i, token in enumerate(oov[1:]):
        chunk = seq[6 * i : 6 * i + 6]
        assert (token == 0) == (len(chunk) < 6 or "N" in chunk)


# -- equality ------------------------------------------------------------------------


@pytest.mark.parametrize("rc", ["none", "average"])
@pytest.mark.parametrize("remainder", gen.REMAINDERS)
def test_matches_reference_fixtures(adapters, expected, remainder, rc):
    seqs = upper_sequences()
    want = expected[f"{remainder}_{rc}"]
    keep = [i for i, s in enumerate(seqs) if remainder == "oov" or len(s) >= 6]
    got = adapters[(remainder, rc)].embed_batch([seqs[i] for i in keep])
    np.testing.assert_allclose(got, want[keep], atol=1e-4, rtol=0)


def test_fixture_vectors_are_not_degenerate(expected):
    oov, trim = expected["oov_none"], expected["trim_none"]
    assert np.isfinite(oov).all()
    assert np.abs(oov[0] - oov[-1]).max() > 0.05
    seqs = upper_sequences()
    ragged = [i for i, s in enumerate(seqs) if len(s) >= 6 and len(s) % 6]
    exact = [i for i, s in enumerate(seqs) if len(s) >= 6 and len(s) % 6 == 0]
    assert np.abs(oov[ragged] - trim[ragged]).max(axis=1).min() > 1e-3
    np.testing.assert_allclose(oov[exact], trim[exact], atol=1e-6)
    assert np.abs(oov - expected["oov_average"]).max() > 0.01


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("oov_last", {"pooling": "last"}),
        ("oov_include", {"special_tokens": "include"}),
        ("oov_layer1", {"layers": (1,)}),
        ("oov_layer0", {"layers": (0,)}),
    ],
)
def test_other_poolings_match_reference(expected, name, options):
    adapter = load_adapter(str(TINY), device="cpu", **options)
    got = adapter.embed_batch(upper_sequences())
    np.testing.assert_allclose(got, expected[name], atol=1e-4, rtol=0)


def test_equals_plain_transformers_llama_and_masked_mean():
    """Reference written out here: LlamaForCausalLM's body, one sequence at a time."""
    from transformers import LlamaForCausalLM

    official = json.loads((FIXTURES / "token_ids.json").read_text())
    model = LlamaForCausalLM.from_pretrained(TINY, dtype=torch.float32).eval()
    seqs = upper_sequences()
    want = []
    for seq in seqs:
        ids = torch.tensor([official[seq]])
        with torch.no_grad():
            hidden = model.model(input_ids=ids).last_hidden_state[0]
        keep = torch.arange(ids.shape[1]) > 0  # BOS excluded
        want.append(hidden[keep].mean(dim=0).numpy())
    got = load_adapter(str(TINY), device="cpu").embed_batch(seqs)  # one padded batch
    np.testing.assert_allclose(got, np.stack(want), atol=1e-5, rtol=0)


@pytest.mark.parametrize("remainder", gen.REMAINDERS)
def test_batched_equals_one_by_one(adapters, remainder):
    # rc average: the forward and reverse-complement passes share one padded batch
    seqs = [s for s in upper_sequences() if len(s) >= 6]
    contract.assert_batched_equals_alone(
        adapters[(remainder, "average")], seqs, atol=1e-5
    )


def test_average_is_rc_invariant(adapters):
    seqs = ["ACGTTGCANNAGTAAC", "GATTACA" * 5, "A" * 13]
    adapter = adapters[("oov", "average")]
    forward = adapter.embed_batch(seqs)
    reverse = adapter.embed_batch([reverse_complement(s) for s in seqs])
    np.testing.assert_allclose(forward, reverse, atol=1e-6, rtol=0)
    none = adapters[("oov", "none")]
    assert (
        np.abs(
            none.embed_batch(seqs)
            - none.embed_batch([reverse_complement(s) for s in seqs])
        ).max()
        > 1e-3
    )


class TestContract(contract.AdapterContract):
    @pytest.fixture(params=["oov", "last"])
    def adapter(self, adapters, request):
        if request.param == "last":
            return load_adapter(str(TINY), device="cpu", pooling="last")
        return adapters[("oov", "none")]


@pytest.mark.cpu_kind
def test_cli_embed_equals_reference(tmp_path, expected):
    seqs = fixture_sequences()  # lower case included: the engine upper-cases
    last, got = contract.embed_cli(tmp_path, TINY, seqs, "--rc", "average")
    assert last == "computed=23 cached=1"
    np.testing.assert_allclose(got, expected["oov_average"], atol=1e-4, rtol=0)


# -- recognition and loading ---------------------------------------------------------


def published_dir(tmp_path: Path, config: str = "config.json") -> Path:
    folder = tmp_path / "published"
    folder.mkdir()
    shutil.copy(PUBLISHED / config, folder / "config.json")
    for name in TOKENIZER_FILES:
        shutil.copy(PUBLISHED / name, folder / name)
    return folder


@pytest.mark.parametrize(
    ("config", "layers", "hidden", "params"),
    [("config.json", 26, 2048, 1.154e9), ("config-3b.json", 30, 3072, 2.986e9)],
)
def test_published_config_is_recognised_and_builds_published_shapes(
    tmp_path, config, layers, hidden, params
):
    from transformers import LlamaModel

    folder = published_dir(tmp_path, config)
    raw = read_config(folder)
    assert raw["auto_map"]["AutoModelForCausalLM"].startswith("modeling_generator.")
    assert recognise_family(raw, folder).FAMILY == "generator"
    gen.check_vocabulary(folder, raw)
    with torch.device("meta"):
        model = LlamaModel(gen.llama_config(raw))
    assert model.config.num_hidden_layers == layers
    assert model.embed_tokens.weight.shape == (4128, hidden)
    assert model.layers[0].self_attn.k_proj.weight.shape == (4 * hidden // 32, hidden)
    assert model.config.rope_parameters["rope_theta"] == 500000.0
    n = sum(p.numel() for p in model.parameters())
    assert abs(n - params) / params < 1e-3


def test_recognised_by_tokenizer_alone_and_plain_llama_is_not(tmp_path):
    folder = published_dir(tmp_path)
    config = read_config(folder)
    # the first hub upload named no repository model class
    config.pop("auto_map")
    config["architectures"] = ["LlamaForCausalLM"]
    assert gen.recognise(config, folder)
    (folder / "tokenizer_config.json").write_text('{"tokenizer_class": "X"}')
    assert not gen.recognise(config, folder)
    assert not gen.recognise({"model_type": "bert"}, folder)


def test_local_dir_needs_no_network_or_remote_code(monkeypatch, tmp_path):
    import huggingface_hub
    import transformers.dynamic_module_utils as dynamic

    def refuse(*args, **kwargs):
        msg = "the hub or remote code was asked for"
        raise AssertionError(msg)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    monkeypatch.setattr(dynamic, "get_class_from_dynamic_module", refuse)
    path = copy_model(tmp_path / "m")
    assert not list(path.glob("*.py"))
    adapter = load_adapter(str(path), device="cpu")
    assert adapter.embed_batch(["ACGTAC"]).shape == (1, 16)


def test_key_records_what_changes_vectors(adapters):
    key = adapters[("oov", "none")].key
    assert key.adapter == "generator"
    assert dict(key.options) == {
        "padding": "right",
        "remainder": "oov",
        "tokenizer": "kmer6-bos",
    }
    assert key.max_length == 64
    assert key.pooling == "mean"
    assert key.special_tokens == "exclude"
    assert key.revision.startswith("sha256:")
    trim = adapters[("trim", "none")].key
    assert dict(trim.options)["remainder"] == "trim"
    assert trim.digest != key.digest


def test_sharded_checkpoint_loads(tmp_path, adapters):
    from transformers import LlamaForCausalLM

    path = tmp_path / "sharded"
    model = LlamaForCausalLM.from_pretrained(TINY, dtype=torch.float32)
    model.save_pretrained(path, max_shard_size="150KB")
    assert (path / "model.safetensors.index.json").is_file()
    assert len(list(path.glob("model-*-of-*.safetensors"))) > 1
    shutil.copy(TINY / "config.json", path / "config.json")  # the published format
    for name in TOKENIZER_FILES:
        shutil.copy(TINY / name, path / name)
    seqs = upper_sequences()
    got = load_adapter(str(path), device="cpu").embed_batch(seqs)
    want = adapters[("oov", "none")].embed_batch(seqs)
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ("rename", "unexpected.*layers.0.mlp.gate_project.weight"),
        ("drop", "missing.*norm.weight"),
        ("foreign", "unexpected.*layers.0.self_attn.q_norm.weight"),
        ("bias", "unexpected.*q_proj.bias"),
    ],
)
def test_wrong_mapping_is_refused(tmp_path, change, match):
    path = copy_model(tmp_path / "m")
    state = load_file(path / "model.safetensors")
    if change == "rename":
        name = "model.layers.0.mlp.gate_proj.weight"
        state[name.replace("gate_proj", "gate_project")] = state.pop(name)
    elif change == "drop":
        del state["model.norm.weight"]
    elif change == "foreign":
        state["model.layers.0.self_attn.q_norm.weight"] = torch.ones(4)
    else:
        state["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(16)
    save_file(state, path / "model.safetensors")
    with pytest.raises(errors.CheckpointError, match=match):
        load_adapter(str(path), device="cpu")


def test_wrong_shape_is_refused(tmp_path):
    path = copy_model(tmp_path / "m")
    contract.edit_config(path, intermediate_size=48)
    with pytest.raises(errors.CheckpointError, match="shape"):
        load_adapter(str(path), device="cpu")


def test_bfloat16_checkpoint_computes_in_the_asked_dtype(tmp_path, adapters):
    path = copy_model(tmp_path / "m")
    state = load_file(path / "model.safetensors")
    save_file(
        {n: t.to(torch.bfloat16) for n, t in state.items()}, path / "model.safetensors"
    )
    adapter = load_adapter(str(path), device="cpu")
    assert adapter.network.model.layers[0].mlp.up_proj.weight.dtype == torch.float32
    seqs = upper_sequences()
    np.testing.assert_allclose(
        adapter.embed_batch(seqs),
        adapters[("oov", "none")].embed_batch(seqs),
        atol=0.05,
        rtol=0,
    )


def test_unbuildable_config_is_refused(tmp_path):
    path = copy_model(tmp_path / "m")
    contract.edit_config(path, hidden_size=15)  # not a multiple of the 4 heads
    with pytest.raises(errors.CheckpointError, match="does not describe a Llama model"):
        load_adapter(str(path), device="cpu")


@pytest.mark.parametrize("change", ["swap", "vocab_size", "k"])
def test_other_vocabulary_is_refused(tmp_path, change):
    path = copy_model(tmp_path / "m")
    if change == "swap":
        lines = (path / "vocab.txt").read_text().splitlines()
        lines[32], lines[33] = "AAAAAT 32", "AAAAAA 33"
        (path / "vocab.txt").write_text("\n".join(lines) + "\n")
        match = "vocab.txt line 33"
    elif change == "vocab_size":
        config = json.loads((path / "config.json").read_text())
        config["vocab_size"] = 4129
        (path / "config.json").write_text(json.dumps(config))
        match = "vocab_size 4129"
    else:
        tok = json.loads((path / "tokenizer_config.json").read_text())
        tok["k"] = 5
        (path / "tokenizer_config.json").write_text(json.dumps(tok))
        match = "k=5"
    with pytest.raises(errors.CheckpointError, match=match):
        load_adapter(str(path), device="cpu")


def test_first_upload_vocab_layout_is_accepted(tmp_path, adapters):
    # the first hub upload's vocab.txt held one piece a line, other annotation names
    path = copy_model(tmp_path / "m")
    lines = [
        line.split(" ")[0] for line in (path / "vocab.txt").read_text().splitlines()
    ]
    lines[16] = "<misc_RNA>"
    (path / "vocab.txt").write_text("\n".join(lines) + "\n")
    got = load_adapter(str(path), device="cpu").embed_batch(["ACGTACGTA"])
    np.testing.assert_allclose(
        got, adapters[("oov", "none")].embed_batch(["ACGTACGTA"]), atol=1e-6
    )


# -- options -------------------------------------------------------------------------


def test_cls_pooling_is_refused_and_says_why():
    with pytest.raises(
        errors.AdapterOptionError, match="BOS <s>, not a classification token"
    ):
        load_adapter(str(TINY), device="cpu", pooling="cls")


@pytest.mark.parametrize(
    ("pairs", "match"),
    [
        ((("remainder", "pad"),), "remainder=pad is not one of oov, trim"),
        ((("kmer", "5"),), "--family-option kmer is not a GENERator option"),
    ],
)
def test_family_options_are_checked(pairs, match):
    with pytest.raises(errors.AdapterOptionError, match=match):
        load_adapter(str(TINY), device="cpu", family_options=pairs)


def test_kmer_split_is_refused():
    with pytest.raises(errors.AdapterOptionError, match="--kmer-split"):
        load_adapter(str(TINY), device="cpu", kmer_split=6)


def test_trim_leaves_nothing_of_a_short_sequence(adapters):
    with pytest.raises(errors.InvalidSequenceError, match="no tokens left"):
        adapters[("trim", "none")].embed_batch(["ACGTACGT", "ACG"])


def test_too_long_raises_unless_truncation():
    adapter = load_adapter(str(TINY), device="cpu")
    long = "ACGTAC" * 70  # 70 tokens + BOS > 64
    assert adapter.n_tokens(long) == 71
    with pytest.raises(errors.SequenceTooLongError, match="more than the 64"):
        adapter.embed_batch(["ACGT", long])
    cut = load_adapter(str(TINY), device="cpu", truncation="right")
    np.testing.assert_allclose(
        cut.embed_batch([long])[0], cut.embed_batch([long[: 63 * 6]])[0], atol=1e-6
    )


def test_random_init_is_seeded_and_uses_llama_init():
    seqs = ["ACGTACGTACGTAA", "GGGCCC"]
    first = contract.seeded_twins(str(TINY), seqs, seeds=(3, 4), min_diff=1e-4)
    weight = first.network.model.embed_tokens.weight.detach()
    assert abs(float(weight.std()) - 0.02) < 0.002  # initializer_range
    assert torch.equal(first.network.model.norm.weight, torch.ones(16))
    trained = load_adapter(str(TINY), device="cpu")
    assert np.abs(trained.embed_batch(seqs) - first.embed_batch(seqs)).max() > 1e-3


def test_bfloat16_stays_close(adapters):
    seqs = upper_sequences()
    exact = adapters[("oov", "none")].embed_batch(seqs)
    adapter = load_adapter(str(TINY), device="cpu", dtype="bfloat16")
    assert adapter.key.dtype == "bfloat16"
    assert adapter.network.model.embed_tokens.weight.dtype == torch.bfloat16
    fast = adapter.embed_batch(seqs)
    assert contract.min_cosine(exact, fast) > 0.999
    assert not np.array_equal(exact, fast)


def test_catalogue_lists_both_checkpoints():
    from embedcache.models.catalogue import load_catalogue

    entries = {e.hub_id: e for e in load_catalogue() if e.family == "generator"}
    assert set(entries) == {
        "GenerTeam/GENERator-eukaryote-1.2b-base",
        "GenerTeam/GENERator-eukaryote-3b-base",
    }
    published = json.loads((PUBLISHED / "config.json").read_text())
    assert {e.context for e in entries.values()} == {
        published["max_position_embeddings"]
    }


def test_kmer_vocabulary_is_product_order():
    assert gen.kmer_vocabulary() == [
        "".join(k) for k in itertools.product("ATCG", repeat=6)
    ]
