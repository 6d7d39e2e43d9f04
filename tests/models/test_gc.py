from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embedcache.analysis.selection import _is_floor_key
from embedcache.errors import AdapterOptionError, InvalidSequenceError
from embedcache.hashing import reverse_complement
from embedcache.models import base, load_adapter
from embedcache.models.floors import gc_content
from embedcache.models.floors.gc_content import GCAdapter, gc_fraction
from tests.models.adapter_contract import AdapterContract, with_random_seqs


class TestGCContract(AdapterContract):
    @pytest.fixture
    def adapter(self):
        return load_adapter("gc")


@pytest.mark.parametrize(
    ("seq", "want"),
    [
        ("GGCC", 1.0),
        ("AATT", 0.0),
        ("ACGT", 0.5),
        ("GATTACA", 2 / 7),  # one G and one C among 7 bases
        ("NNGCNA", 2 / 3),  # N counts in neither: G C over G C A
        ("CNNNNNNN", 1.0),
        ("NNNN", 0.5),  # no A/C/G/T at all: the documented neutral value
    ],
)
def test_gc_fraction_by_hand(seq, want):
    assert gc_fraction(seq) == pytest.approx(want)


def test_vector_is_one_float32_feature():
    out = load_adapter("gc").embed_batch(["GATTACA", "GGGG", "NNN"])
    assert out.shape == (3, 1)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out[:, 0], [2 / 7, 1.0, 0.5], rtol=1e-6)


def test_rejects_other_characters():
    with pytest.raises(InvalidSequenceError, match=r"'X' at position 2"):
        gc_fraction("AXGT")


def test_key_is_a_floor_and_rc_does_not_apply():
    key = load_adapter("gc").key
    assert (key.model_id, key.adapter, key.rc_mode) == ("gc", "gc", "none")
    assert key.revision == "builtin-v1"
    assert _is_floor_key(key)
    assert load_adapter("gc", rc_mode="none").key == key
    with pytest.raises(AdapterOptionError, match="both strands"):
        load_adapter("gc", rc_mode="average")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"layers": (3,)}, "--layer"),
        ({"random_init": 1}, "--random-init"),
        ({"pooling": "cls"}, "--pooling"),
        ({"kmer_split": 3}, "--kmer-split"),
        ({"revision": "abc"}, "drop --revision"),
        ({"truncation": "right"}, "--truncate"),
    ],
)
def test_options_that_do_not_apply_raise(kwargs, match):
    with pytest.raises(AdapterOptionError, match=match):
        load_adapter("gc", **kwargs)


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="ACGTN", min_size=1, max_size=200))
def test_strand_symmetric_and_in_unit_interval(seq):
    value = gc_fraction(seq)
    assert 0.0 <= value <= 1.0
    assert value == gc_fraction(reverse_complement(seq))
    assert GCAdapter().embed_batch([seq])[0, 0] == np.float32(value)


@pytest.mark.parametrize("max_bases", [1 << 20, 5])
def test_a_batch_counts_each_sequence_on_its_own(monkeypatch, max_bases):
    # slices of one or two sequences give the rows one slice gives
    real = base.packed_codes
    monkeypatch.setattr(
        gc_content,
        "packed_codes",
        lambda *a, **kw: real(
            *a, **{**kw, "max_bases": min(kw["max_bases"], max_bases)}
        ),
    )
    edges = ["", "N", "NNNN", "GC", "ATN"]
    seqs = with_random_seqs(edges, seed=3, n=50, max_len=30)
    want = []
    for seq in seqs:  # the module docstring's rule, in plain Python
        gc, at = sum(seq.count(b) for b in "GC"), sum(seq.count(b) for b in "AT")
        want.append(gc / (gc + at) if gc + at else 0.5)
    got = GCAdapter().embed_batch(seqs)
    assert got.shape == (len(seqs), 1)
    assert got[:, 0].tolist() == np.asarray(want, np.float32).tolist()


def test_a_batch_names_the_character_of_its_first_bad_sequence():
    with pytest.raises(
        InvalidSequenceError, match="'x' at position 2 of a sequence of length 3"
    ):
        GCAdapter().embed_batch(["ACGT", "AxG", "ACGTX"])
