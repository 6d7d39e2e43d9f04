from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from embedcache.hashing import normalise_sequence, reverse_complement, sequence_key

dna = st.text(alphabet="ACGTNacgtn", min_size=1, max_size=300)


@given(dna)
def test_revcomp_roundtrip(seq):
    assert reverse_complement(reverse_complement(seq)) == seq


@given(dna)
def test_sequence_key_ignores_case(seq):
    assert sequence_key(seq.lower()) == sequence_key(seq.upper())


def test_sequence_key_is_sha256_of_upper_case():
    assert sequence_key("acgN") == hashlib.sha256(b"ACGN").hexdigest()


def test_reverse_complement_by_hand():
    assert reverse_complement("AACGTN") == "NACGTT"
    assert reverse_complement("acGt") == "aCgt"


def test_normalise_upper_cases():
    assert normalise_sequence("acgtn") == "ACGTN"
