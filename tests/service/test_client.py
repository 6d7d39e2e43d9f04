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
from tests.engine.helpers import write_small_version
from tests.service.conftest import random_seqs, run_cli

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


def test_429_and_503_are_retried_honouring_retry_after_with_jitter(waits):
    answers = iter(
        [
            error(429, "queue full", headers={"Retry-After": "2"}),
            error(503, "draining", headers={"Retry-After": "1"}),
            *[error(429, "queue full", headers={"Retry-After": "1"})] * 6,
        ]
    )
    script = Script(lambda request, seqs: next(answers, None))
    with client_of(script, max_backoff=30) as client:
        vectors = client.embed(["ACGT"], model="m")
    np.testing.assert_array_equal(vectors[0], vector_of("ACGT"))
    assert len(script.requests) == 9
    assert 2.0 <= waits[0] <= 3.0
    assert all(1.0 <= w <= 1.5 for w in waits[1:])
    # spread: clients told "1 s" together do not all come back at 1 s
    assert len(set(waits[1:])) == len(waits[1:])
    with (
        client_of(
            Script(
                lambda request, seqs: error(429, "x", headers={"Retry-After": "60"})
            ),
            max_retries=1,
            max_backoff=4,
        ) as client,
        pytest.raises(ServiceError),
    ):
        client.embed(["ACGT"], model="m")
    assert 4.0 <= waits[-1] <= 6.0  # capped, then spread


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


def test_a_backend_fault_is_retried_and_a_corrupt_store_is_not(waits):
    answers = iter([error(424, "the model's device failed")] * 2)
    script = Script(lambda request, seqs: next(answers, None))
    with client_of(script, backoff=0.1) as client:
        vectors = client.embed(["ACGT"], model="m")
    np.testing.assert_array_equal(vectors[0], vector_of("ACGT"))
    assert len(script.requests) == 3
    corrupt = Script(lambda request, seqs: error(500, "a stored chunk is corrupt"))
    with (
        client_of(corrupt) as client,
        pytest.raises(ServiceError, match="500 a stored chunk is corrupt") as info,
    ):
        client.embed(["ACGT"], model="m")
    assert info.value.status == 500
    assert len(corrupt.requests) == 1


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


# --- against a real server (the `served` fixture of conftest.py) ----------------------


@pytest.mark.cpu_kind
def test_client_vectors_are_what_embed_stores_under_the_same_key(served, tmp_path):
    seqs = random_seqs(40, seed=11)
    seqs += [seqs[3].lower(), seqs[0]]
    with EmbedClient(served.url) as client:
        names = {m["id"]: m for m in client.models()}
        served_items = client.embed_items(seqs, model="bert")
        vectors = client.embed(seqs, model="bert")
    assert {"bert", "kmer-4"} <= set(names)
    assert served_items.key_digest == names["bert"]["key_digest"]
    assert vectors.shape == (42, names["bert"]["dim"])
    np.testing.assert_array_equal(vectors, served_items.vectors)  # NPY == Arrow
    np.testing.assert_array_equal(vectors[40], vectors[3])
    assert not served_items.cached.any()  # a repeat shares its first row's flag
    assert (served_items.n_computed, served_items.n_cached) == (40, 2)
    # the same model and options here find every vector in the server's store
    (tmp_path / "in.txt").write_text("\n".join(seqs) + "\n")
    out = run_cli(
        "embed",
        "--model",
        served.bert_dir,
        "--store",
        served.store,
        "--device",
        "cpu",
        "--dtype",  # what the server computes in
        "float32",
        "--input",
        tmp_path / "in.txt",
        "--output",
        tmp_path / "local.npy",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "computed=0 cached=42"
    np.testing.assert_array_equal(np.load(tmp_path / "local.npy"), vectors)


def test_cli_embed_through_the_server_prints_the_same_counts(served, tmp_path):
    seqs = random_seqs(25, seed=12)
    (tmp_path / "in.txt").write_text("\n".join([*seqs, seqs[5], seqs[5]]) + "\n")
    args = ["embed", "--server", served.url, "--model", "bert"]
    args += ["--input", tmp_path / "in.txt"]
    first = run_cli(*args, "--output", tmp_path / "a.npy")
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip().splitlines()[-1] == "computed=25 cached=2"
    second = run_cli(*args, "--output", tmp_path / "b.npy")
    assert second.stdout.strip().splitlines()[-1] == "computed=0 cached=27"
    a, b = np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy")
    assert a.dtype == np.float32
    np.testing.assert_array_equal(a, b)
    with EmbedClient(served.url) as client:
        np.testing.assert_array_equal(
            a, client.embed([*seqs, *seqs[5:6] * 2], model="bert")
        )
    # options the server fixes are refused, not silently ignored
    refused = run_cli(*args, "--output", tmp_path / "c.npy", "--dtype", "bfloat16")
    assert refused.returncode == 2
    assert "--dtype cannot be given with --server" in refused.stderr
    assert not (tmp_path / "c.npy").exists()


def test_cli_embeddings_through_the_server_fill_the_store_the_report_reads(
    served, tmp_path
):
    version = write_small_version(tmp_path / "small.toml")
    env_args = ["embeddings", "--model", "kmer-4", "--version", version]
    remote = run_cli(*env_args, "--server", served.url)
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout.strip().splitlines()[-1] == "computed=100 cached=0"
    local = run_cli(*env_args, "--store", served.store)
    assert local.returncode == 0, local.stderr
    assert local.stdout.strip().splitlines()[-1] == "computed=0 cached=100"


def test_client_splits_what_the_server_would_refuse_as_too_large(served):
    # the server takes at most 2000 sequences a request; the client tries 3000
    seqs = random_seqs(3000, seed=13, low=8, high=30)
    with EmbedClient(served.url, max_sequences=3000) as client:
        vectors = client.embed(seqs, model="kmer-4")
        again = client.embed(seqs[2500:], model="kmer-4")
    assert vectors.shape == (len(seqs), 256)
    np.testing.assert_array_equal(again, vectors[2500:])
    assert "413" in served.log()


def test_client_errors_from_a_real_server_name_the_input(served):
    seqs = random_seqs(5, seed=14)
    with EmbedClient(served.url) as client:
        with pytest.raises(UnknownModelError, match="bert"):
            client.embed(seqs, model="no-such-model")
        too_long = [*seqs, "ACGT" * 40]
        with pytest.raises(SequenceTooLongError, match=r"^sequence 5: "):
            client.embed(too_long, model="bert")
