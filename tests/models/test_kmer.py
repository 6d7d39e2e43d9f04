from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embedcache import errors
from embedcache.hashing import reverse_complement
from embedcache.models import BUILTIN_MODELS, load_adapter
from embedcache.models.floors import kmer
from embedcache.models.floors.kmer import (
    KmerAdapter,
    kmer_names,
    kmer_spectra,
    kmer_spectrum,
)
from tests.models.adapter_contract import AdapterContract, with_random_seqs


def as_dict(vector, k):
    names = kmer_names(k)
    return {names[i]: round(float(vector[i]), 6) for i in np.flatnonzero(vector)}


class TestKmerContract(AdapterContract):
    @pytest.fixture(params=[1, 3, 6])
    def adapter(self, request):
        return load_adapter(f"kmer-{request.param}")


class TestKmerAverageContract(AdapterContract):
    @pytest.fixture
    def adapter(self):
        return load_adapter("kmer-4", rc_mode="average")


def test_builtins_are_kmer_1_to_6_and_gc():
    assert BUILTIN_MODELS == (
        "kmer-1",
        "kmer-2",
        "kmer-3",
        "kmer-4",
        "kmer-5",
        "kmer-6",
        "gc",
    )
    for k, name in enumerate(BUILTIN_MODELS[:6], start=1):
        assert load_adapter(name).dim == 4**k


def test_kmer_names_are_lexicographic():
    assert kmer_names(1) == ["A", "C", "G", "T"]
    assert kmer_names(2)[:5] == ["AA", "AC", "AG", "AT", "CA"]
    assert kmer_names(3)[-1] == "TTT"
    assert kmer_names(2).index("GT") == 2 * 4 + 3


def test_spectrum_hand_computed():
    # ACGTNAC: 2-mers AC CG GT TN NA AC; the two with N are skipped -> 4 counted
    assert as_dict(kmer_spectrum("ACGTNAC", 2), 2) == {
        "AC": 0.5,
        "CG": 0.25,
        "GT": 0.25,
    }
    assert as_dict(kmer_spectrum("AACA", 1), 1) == {"A": 0.75, "C": 0.25}
    assert as_dict(kmer_spectrum("AAAA", 3), 3) == {"AAA": 1.0}
    # 3-mers of GATTACA: GAT ATT TTA TAC ACA
    assert as_dict(kmer_spectrum("GATTACA", 3), 3) == {
        "GAT": 0.2,
        "ATT": 0.2,
        "TTA": 0.2,
        "TAC": 0.2,
        "ACA": 0.2,
    }


def test_spectrum_without_valid_kmer_is_zero():
    assert not kmer_spectrum("NNNN", 1).any()
    assert not kmer_spectrum("ANA", 2).any()
    assert not kmer_spectrum("AC", 3).any()  # shorter than k


def test_spectrum_rejects_other_characters():
    with pytest.raises(errors.InvalidSequenceError, match=r"'X' at position 3"):
        kmer_spectrum("ACXT", 2)
    with pytest.raises(errors.InvalidSequenceError, match="position 1"):
        kmer_spectrum("acgt", 2)  # the engine upper-cases before calling an adapter


def test_average_mode_is_the_mean_of_both_strands():
    seq = "AACGTTTGCN"
    fwd = load_adapter("kmer-2").embed_batch([seq])[0]
    rev = load_adapter("kmer-2").embed_batch([reverse_complement(seq)])[0]
    avg = load_adapter("kmer-2", rc_mode="average").embed_batch([seq])[0]
    np.testing.assert_allclose(avg, (fwd + rev) / 2, atol=1e-7)


def test_key_records_k_and_rc_mode():
    plain, avg = (
        load_adapter("kmer-3").key,
        load_adapter("kmer-3", rc_mode="average").key,
    )
    assert plain.model_id == "kmer-3"
    assert plain.adapter == "kmer"
    assert plain.rc_mode == "none"
    assert avg.rc_mode == "average"
    assert plain.digest != avg.digest
    assert plain.digest != load_adapter("kmer-4").key.digest
    # dtype does not change a k-mer vector, so it does not split the cache
    assert load_adapter("kmer-3", dtype="bfloat16").key == plain


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"layers": (2,)}, "--layer"),
        ({"pooling": "cls"}, "--pooling"),
        ({"random_init": 1}, "--random-init"),
        ({"kmer_split": 3}, "--kmer-split"),
        ({"revision": "abc"}, "drop --revision"),
        ({"truncation": "right"}, "--truncate"),
        ({"rc_mode": "flip"}, "rc mode 'flip'"),
    ],
)
def test_options_that_do_not_apply_raise(kwargs, match):
    with pytest.raises(errors.AdapterOptionError, match=match):
        load_adapter("kmer-2", **kwargs)


def test_near_miss_names_are_unknown():
    for name in ("kmer-7", "kmer-0", "kmer4", "k-mer-4"):
        with pytest.raises(errors.UnknownModelError, match="kmer-1"):
            load_adapter(name)
    with pytest.raises(errors.AdapterOptionError):
        KmerAdapter(7)


@settings(max_examples=200, deadline=None)
@given(seq=st.text(alphabet="ACGTN", min_size=0, max_size=200), k=st.integers(1, 4))
def test_spectrum_sums_to_one_or_zero(seq, k):
    spectrum = kmer_spectrum(seq, k)
    assert spectrum.shape == (4**k,)
    assert (spectrum >= 0).all()
    has_valid = any("N" not in seq[i : i + k] for i in range(len(seq) - k + 1))
    assert spectrum.sum() == pytest.approx(1.0 if has_valid else 0.0, abs=1e-6)


@settings(max_examples=200, deadline=None)
@given(seq=st.text(alphabet="ACGTN", min_size=1, max_size=200), k=st.integers(1, 4))
def test_reverse_complement_permutes_the_spectrum(seq, k):
    # every k-mer w of rc(s) is rc(w') for a k-mer w' of s, so the spectra are a permutation
    names = kmer_names(k)
    index = {name: i for i, name in enumerate(names)}
    perm = [index[reverse_complement(name)] for name in names]
    np.testing.assert_allclose(
        kmer_spectrum(reverse_complement(seq), k),
        kmer_spectrum(seq, k)[perm],
        atol=1e-7,
    )


@settings(max_examples=100, deadline=None)
@given(seq=st.text(alphabet="ACGTN", min_size=1, max_size=100))
def test_average_mode_is_strand_invariant(seq):
    adapter = KmerAdapter(3, rc_mode="average")
    np.testing.assert_allclose(
        adapter.embed_batch([seq])[0],
        adapter.embed_batch([reverse_complement(seq)])[0],
        atol=1e-7,
    )


def spectrum_by_hand(seq, k):
    """The rule of the module docstring, a window at a time in plain Python."""
    names = kmer_names(k)
    counts = dict.fromkeys(names, 0)
    for i in range(len(seq) - k + 1):
        if "N" not in seq[i : i + k]:
            counts[seq[i : i + k]] += 1
    total = sum(counts.values())
    return np.array(
        [counts[name] / total if total else 0.0 for name in names], np.float32
    )


@pytest.mark.parametrize("k", [1, 2, 5])
@pytest.mark.parametrize(("slice_bases", "slice_cells"), [(1 << 20, 1 << 22), (7, 40)])
def test_a_batch_counts_each_sequence_on_its_own(
    monkeypatch, k, slice_bases, slice_cells
):
    # windows spanning two sequences of the batch are not counted; small slices
    # (one or two sequences at a time) give the same rows as one slice
    monkeypatch.setattr(kmer, "_SLICE_BASES", slice_bases)
    monkeypatch.setattr(kmer, "_SLICE_CELLS", slice_cells)
    edges = ["", "A", "NN", "ACGTN", "GATTACA"]
    seqs = with_random_seqs(edges, seed=k, n=60, max_len=40)
    got = kmer_spectra(seqs, k)
    assert got.shape == (len(seqs), 4**k)
    assert got.dtype == np.float32
    for row, seq in zip(got, seqs, strict=True):
        np.testing.assert_allclose(row, spectrum_by_hand(seq, k), atol=1e-7)


def test_a_batch_names_the_character_of_its_first_bad_sequence():
    with pytest.raises(
        errors.InvalidSequenceError, match="'X' at position 3 of a sequence of length 4"
    ):
        kmer_spectra(["ACGT", "AAAA", "ACXT", "AXAA"], 2)
