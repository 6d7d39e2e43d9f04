"""`embedcache.client`: the Python client, first against a scripted transport (order,
splitting, retries, errors), then against a real `embedcache serve`."""

from __future__ import annotations

import hashlib
import json

import httpx
import numpy as np
import pytest

from embedcache.client import EmbedClient, ServiceAuthError, ServiceError
from embedcache.errors import (
    InvalidSequenceError,
    SequenceTooLongError,
    UnknownModelError,
)
from embedcache.hashing import sequence_key
from embedcache.service import wire

DIM = 4
DIGEST = "ab" * 32


def vector_of(seq):
    """A made-up vector a scripted server answers for ``seq``: its hash's bytes."""
    raw = hashlib.sha256(seq.encode()).digest()[:DIM]
    return np.frombuffer(raw, dtype=np.uint8).astype(np.float32)


class Script:
    """A scripted server: answers /v1/embed like the real one, or as ``refuse`` says.

    ``refuse(request, seqs)`` returns a response to send instead, or None.
    """

    def __init__(self, refuse=None, stored=()):
        self.refuse = refuse
        self.stored = set(stored)
        self.requests = []

    def __call__(self, request):
        body = json.loads(request.content) if request.content else None
        self.requests.append((request, body))
        seqs = body["sequences"] if body else []
        if self.refuse is not None:
            response = self.refuse(request, seqs)
            if response is not None:
                return response
        if request.url.path == wire.ROUTE_MODELS:
            return httpx.Response(200, json={"object": "list", "data": [{"id": "m"}]})
        vectors = np.stack([vector_of(s) for s in seqs])
        cached = [s in self.stored for s in seqs]
        self.stored.update(seqs)
        headers = {wire.HEADER_KEY_DIGEST: DIGEST}
        if request.headers["accept"] == wire.MEDIA_NPY:
            return httpx.Response(
                200, content=wire.encode_npy(vectors), headers=headers
            )
        content = wire.encode_arrow(
            vectors,
            hashes=[sequence_key(s) for s in seqs],
            cached=cached,
            metadata={wire.ARROW_META_KEY_DIGEST: DIGEST.encode()},
        )
        return httpx.Response(200, content=content, headers=headers)

    @property
    def sent(self):
        return [body["sequences"] for _, body in self.requests if body]


def error(status, message, *, index=None, headers=None):
    body = wire.error_body(message, status=status, index=index)
    return httpx.Response(status, json=body, headers=headers)


@pytest.fixture
def waits(monkeypatch):
    """The client's sleeps between retries, recorded instead of slept."""
    slept = []
    monkeypatch.setattr("embedcache.client.time.sleep", slept.append)
    return slept


def client_of(script, **kwargs):
    return EmbedClient("http://test", transport=httpx.MockTransport(script), **kwargs)


# --- against a scripted transport ---------------------------------------------------


def test_embed_rows_in_input_order_each_distinct_sequence_sent_once():
    script = Script()
    seqs = ["ACGT", "ggcc", "TTAN", "ACGT", "GGCC"]
    with client_of(script) as client:
        vectors = client.embed(seqs, model="m")
    assert vectors.dtype == np.float32
    assert vectors.shape == (5, DIM)
    for row, seq in zip(vectors, seqs, strict=True):
        np.testing.assert_array_equal(row, vector_of(seq.upper()))
    assert script.sent == [["ACGT", "GGCC", "TTAN"]]
    request, body = script.requests[0]
    assert request.headers["accept"] == wire.MEDIA_NPY
    assert body["model"] == "m"


def test_requests_stay_within_the_count_and_body_limits():
    script = Script()
    seqs = [f"{'ACGT' * (i + 1)}" for i in range(10)]
    with client_of(script, max_sequences=3, concurrency=3) as client:
        vectors = client.embed(seqs, model="m")
    assert [len(s) for s in script.sent] == [3, 3, 3, 1]
    np.testing.assert_array_equal(vectors[7], vector_of(seqs[7]))
    script = Script()
    with client_of(script, max_body_bytes=30) as client:
        client.embed(seqs[:4], model="m")  # 8, 12, 16, 20 bp: 4 bytes JSON each more
    assert [len(s) for s in script.sent] == [2, 1, 1]


def test_a_413_halves_the_request_until_it_fits():
    def refuse(request, seqs):
        if len(seqs) > 2:
            return error(413, "more than 2 sequences")
        return None

    script = Script(refuse)
    seqs = [s * 3 for s in ("A", "C", "G", "T", "AC", "GT", "CA")]
    with client_of(script) as client:
        vectors = client.embed(seqs, model="m")
    accepted = [sent for sent in script.sent if len(sent) <= 2]
    assert [x for sent in accepted for x in sent] == seqs  # 7 -> 3 + 4 -> 1+2 + 2+2
    assert len(script.sent) == 7
    for row, seq in zip(vectors, seqs, strict=True):
        np.testing.assert_array_equal(row, vector_of(seq))


def test_429_and_503_are_retried_honouring_retry_after(waits):
    answers = iter(
        [
            error(429, "queue full", headers={"Retry-After": "2"}),
            error(503, "draining", headers={"Retry-After": "1"}),
        ]
    )
    script = Script(lambda request, seqs: next(answers, None))
    with client_of(script) as client:
        vectors = client.embed(["ACGT"], model="m")
    np.testing.assert_array_equal(vectors[0], vector_of("ACGT"))
    assert waits == [2.0, 1.0]
    assert len(script.requests) == 3


def test_without_retry_after_the_backoff_grows_and_then_gives_up(waits):
    script = Script(lambda request, seqs: error(503, "draining"))
    with (
        client_of(script, max_retries=4, backoff=0.1, max_backoff=0.5) as client,
        pytest.raises(ServiceError, match=r"503 draining.*after 5 attempts") as info,
    ):
        client.embed(["ACGT"], model="m")
    assert info.value.status == 503
    assert len(script.requests) == 5
    assert len(waits) == 4
    bounds = [min(0.5, 0.1 * 2**i) for i in range(4)]
    assert all(b / 2 <= w <= b for w, b in zip(waits, bounds, strict=True))


def test_a_dropped_connection_is_retried_then_named(waits):
    calls = []

    def handler(request):
        calls.append(request)
        msg = "connection refused"
        raise httpx.ConnectError(msg, request=request)

    client = EmbedClient(
        "http://test", transport=httpx.MockTransport(handler), max_retries=2
    )
    with pytest.raises(ServiceError, match="is the server running at http://test"):
        client.embed(["ACGT"], model="m")
    assert len(calls) == 3


def test_a_bad_character_is_named_by_input_index_and_nothing_is_sent():
    script = Script()
    with (
        client_of(script) as client,
        pytest.raises(InvalidSequenceError, match="sequence 2: invalid character 'X'"),
    ):
        client.embed(["ACGT", "AC", "ACXT"], model="m")
    assert script.requests == []


def test_a_422_is_named_by_its_index_in_the_input_not_the_request():
    def refuse(request, seqs):
        if "A" * 9 in seqs:
            return error(422, "sequence 1 is too long", index=seqs.index("A" * 9))
        return None

    # distinct sequences go 3 a request; the long one is the 2nd of the 2nd request
    # and, with repeats before it, row 6 of the input
    seqs = ["AC", "GT", "AC", "CA", "TG", "GG", "A" * 9, "CC"]
    with (
        client_of(Script(refuse), max_sequences=3) as client,
        pytest.raises(SequenceTooLongError, match=r"^item6 \(sequence 6\): ") as info,
    ):
        client.embed_items(seqs, model="m", names=[f"item{i}" for i in range(8)])
    assert "too long" in str(info.value)


def test_unknown_model_and_auth_errors_carry_the_servers_message():
    def refuse(request, seqs):
        if request.headers.get("authorization") != "Bearer k1":
            return error(401, "missing or wrong API key")
        return error(404, "model 'x' is not served; served: m")

    with (
        client_of(Script(refuse)) as client,
        pytest.raises(ServiceAuthError, match="EMBEDCACHE_API_KEY"),
    ):
        client.models()
    client = EmbedClient(
        "http://test", "k1", transport=httpx.MockTransport(Script(refuse))
    )
    with pytest.raises(UnknownModelError, match="served: m"):
        client.embed(["ACGT"], model="x")


def test_embed_items_flags_what_the_server_had_and_counts_distinct_computed():
    script = Script(stored={"GGCC"})
    seqs = ["ACGT", "GGCC", "acgt", "TTAA", "GGCC"]
    with client_of(script, max_sequences=2) as client:
        served = client.embed_items(seqs, model="m")
    assert served.key_digest == DIGEST
    assert served.hashes == [sequence_key(s) for s in seqs]
    assert served.cached.tolist() == [False, True, False, False, True]
    assert (served.n_computed, served.n_cached) == (2, 3)
    assert script.requests[0][0].headers["accept"] == wire.MEDIA_ARROW
    for row, seq in zip(served.vectors, seqs, strict=True):
        np.testing.assert_array_equal(row, vector_of(seq.upper()))


def test_one_string_is_refused_rather_than_split_into_letters():
    with client_of(Script()) as client, pytest.raises(TypeError, match=r"\[seq\]"):
        client.embed("ACGT", model="m")
