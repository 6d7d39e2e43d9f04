"""`embedcache serve` end to end: a real server in a subprocess, every route, the
openai client, concurrent overlapping clients, each error code, a client that leaves."""

from __future__ import annotations

import json
import socket
import threading
import time

import numpy as np
import pytest

from embedcache.hashing import sequence_key
from embedcache.service import wire
from tests.service.conftest import random_seqs


def embed(server, model, seqs, **kwargs):
    with server.client() as client:
        return client.post(
            wire.ROUTE_EMBED, json={"model": model, "sequences": seqs}, **kwargs
        )


def stored_vectors(store_path, digest, seqs):
    from embedcache.store import EmbeddingStore

    store = EmbeddingStore(store_path, create=False)
    infos = store.keys()  # KeyInfo records (a list, not a dict's keys)
    key = next(info.key for info in infos if info.digest == digest)
    vectors, found = store.get(key, [sequence_key(s) for s in seqs])
    assert found.all()
    return np.asarray(vectors, dtype=np.float32)


def assert_error(response, status, *, index=None, says=()):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"]["type"] == wire.ERROR_TYPES[status]
    assert body["error"].get("index") == index
    for word in says:
        assert word in body["error"]["message"]
    assert "Traceback" not in response.text


def test_health_models_metrics_and_schema(served):
    with served.client() as client:
        assert client.get(wire.ROUTE_LIVE).json() == {"status": "live"}
        assert client.get(wire.ROUTE_READY).json() == {"status": "ready"}
        models = client.get(wire.ROUTE_MODELS).json()
        paths = client.get(wire.ROUTE_OPENAPI).json()["paths"]
        metrics = client.get(wire.ROUTE_METRICS)
    by_name = {m["id"]: m for m in models["data"]}
    assert set(by_name) == {"kmer-4", "bert"}
    assert by_name["kmer-4"]["dim"] == 256
    assert by_name["kmer-4"]["family"] == "kmer"
    assert by_name["bert"]["dim"] == 16
    assert by_name["bert"]["key"]["dtype"] == "float32"
    assert len(by_name["bert"]["key_digest"]) == 64
    assert models["limits"]["max_sequences"] == 2000
    for route in (wire.ROUTE_EMBED, wire.ROUTE_EMBEDDINGS, wire.ROUTE_MODELS):
        assert route in paths
    assert metrics.headers["content-type"].startswith("text/plain")
    for name in (
        "embedcache_requests_total",
        "embedcache_request_seconds_bucket",
        "embedcache_queue_tokens",
    ):
        assert name in metrics.text


def test_native_route_in_json_arrow_and_npy(served):
    seqs = random_seqs(7, seed=1)
    seqs.append(seqs[0].lower())  # the same sequence in another case: one key
    first = embed(served, "bert", seqs)
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["n_computed"] == 7
    assert body["n_cached"] == 1
    assert [item["sha256"] for item in body["data"]] == [sequence_key(s) for s in seqs]
    assert not any(item["cached"] for item in body["data"])
    as_json = np.array([item["embedding"] for item in body["data"]], dtype=np.float32)
    arrow = embed(served, "bert", seqs, headers={"Accept": wire.MEDIA_ARROW})
    npy = embed(served, "bert", seqs, headers={"Accept": wire.MEDIA_NPY})
    assert arrow.headers["content-type"] == wire.MEDIA_ARROW
    assert npy.headers[wire.HEADER_CACHED] == str(len(seqs))
    assert npy.headers[wire.HEADER_KEY_DIGEST] == body["key_digest"]
    np.testing.assert_array_equal(wire.decode_arrow(arrow.content), as_json)
    np.testing.assert_array_equal(wire.decode_npy(npy.content), as_json)
    np.testing.assert_array_equal(as_json[0], as_json[-1])
    np.testing.assert_array_equal(
        as_json, stored_vectors(served.store, body["key_digest"], seqs)
    )
    import pyarrow as pa

    table = pa.ipc.open_stream(arrow.content).read_all()
    assert table.column(wire.ARROW_CACHED).to_pylist() == [True] * len(seqs)
    assert (
        table.schema.metadata[wire.ARROW_META_KEY_DIGEST].decode() == body["key_digest"]
    )


def test_openai_client_works_unchanged(served):
    openai = pytest.importorskip("openai")
    seqs = random_seqs(5, seed=2)
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)
    reply = client.embeddings.create(model="bert", input=seqs)  # base64 on the wire
    floats = client.embeddings.create(model="bert", input=seqs, encoding_format="float")
    one = client.embeddings.create(model="kmer-4", input=seqs[0])
    got = np.array([d.embedding for d in reply.data], dtype=np.float32)
    native = embed(served, "bert", seqs).json()
    expected = np.array([d["embedding"] for d in native["data"]], dtype=np.float32)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(
        np.array([d.embedding for d in floats.data], dtype=np.float32), expected
    )
    assert [d.index for d in reply.data] == list(range(5))
    # the tiny BERT's tokenizer: one token a base plus [CLS] and [SEP]
    assert reply.usage.prompt_tokens == sum(len(s) + 2 for s in seqs)
    assert len(one.data) == 1
    assert len(one.data[0].embedding) == 256
    assert [m.id for m in client.models.list().data] == ["kmer-4", "bert"]


def test_concurrent_overlapping_clients_get_stored_vectors_computed_once(
    served, tmp_path
):
    pool = random_seqs(60, seed=3)
    rng = np.random.default_rng(4)
    asks = [[pool[i] for i in rng.choice(60, size=25, replace=False)] for _ in range(8)]
    before = served.metric("embedcache_sequences_computed_total", "bert")
    start = threading.Barrier(8)
    replies = [None] * 8

    def ask(n):
        start.wait()
        replies[n] = embed(served, "bert", asks[n], headers={"Accept": wire.MEDIA_NPY})

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    distinct = {s for ask_ in asks for s in ask_}
    after = served.metric("embedcache_sequences_computed_total", "bert")
    assert after - before == len(distinct)
    digest = replies[0].headers[wire.HEADER_KEY_DIGEST]
    for seqs, reply in zip(asks, replies, strict=True):
        assert reply.status_code == 200, reply.text
        np.testing.assert_array_equal(
            wire.decode_npy(reply.content), stored_vectors(served.store, digest, seqs)
        )
    # `embedcache embed` (its package call, embed_file) on the same store reads
    # exactly these vectors back
    from embedcache.engine.api import embed_file

    every = sorted(distinct)
    (tmp_path / "seqs.txt").write_text("\n".join(every) + "\n")
    result = embed_file(tmp_path / "seqs.txt", str(served.bert_dir), served.store)
    assert (result.n_computed, result.n_cached) == (0, len(every))
    reply = embed(served, "bert", every, headers={"Accept": wire.MEDIA_NPY})
    np.testing.assert_array_equal(result.vectors, wire.decode_npy(reply.content))
    # and a fresh store's `embed` (other batches) agrees to float32 rounding
    fresh = embed_file(tmp_path / "seqs.txt", str(served.bert_dir), tmp_path / "fresh")
    assert fresh.n_computed == len(every)
    np.testing.assert_allclose(fresh.vectors, result.vectors, rtol=1e-5, atol=1e-6)


def test_error_replies(served):
    with served.client() as client:
        bad_json = client.post(
            wire.ROUTE_EMBED,
            content=b'{"model":',
            headers={"content-type": "application/json"},
        )
        wrong_type = client.post(
            wire.ROUTE_EMBED, json={"model": "bert", "sequences": ["ACGT", 5]}
        )
        no_model = client.post(wire.ROUTE_EMBEDDINGS, json={"input": "ACGT"})
        unknown = client.post(
            wire.ROUTE_EMBED, json={"model": "nt-v2", "sequences": ["ACGT"]}
        )
        bad_char = client.post(
            wire.ROUTE_EMBED, json={"model": "bert", "sequences": ["ACGT", "ACGUA"]}
        )
        too_long = client.post(
            wire.ROUTE_EMBEDDINGS,
            json={"model": "bert", "input": ["ACGT", "ACGT", "A" * 200]},
        )
        too_many = client.post(
            wire.ROUTE_EMBED, json={"model": "kmer-4", "sequences": ["ACGT"] * 2001}
        )
        too_big = client.post(
            wire.ROUTE_EMBED, json={"model": "kmer-4", "sequences": ["A" * 2**20]}
        )
        no_route = client.get("/v2/nothing")
    assert_error(bad_json, 400, says=["JSON"])
    assert_error(wrong_type, 400, index=1, says=["sequences.1"])
    assert_error(no_model, 400, says=["model"])
    assert_error(unknown, 404, says=["nt-v2", "'kmer-4'", "'bert'"])
    assert_error(bad_char, 422, index=1, says=["'U'", "position 4"])
    assert_error(too_long, 422, index=2, says=["202 tokens", "maximum is 64"])
    assert_error(too_many, 413, says=["2001", "2000"])
    assert_error(too_big, 413, says=[str(2**20)])
    assert no_route.status_code == 404
    assert "error" in no_route.json()


def test_a_client_that_leaves_has_its_queued_work_dropped(served):
    seqs = random_seqs(1500, seed=5, low=55, high=62)
    before = served.metric("embedcache_sequences_computed_total", "bert")
    body = json.dumps({"model": "bert", "sequences": seqs}).encode()
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        head = (
            f"POST {wire.ROUTE_EMBED} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        sock.sendall(head + body)
        deadline = time.monotonic() + 30
        while served.metric("embedcache_sequences_computed_total", "bert") == before:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    deadline = time.monotonic() + 30
    while served.metric("embedcache_sequences_dropped_total", "bert") == 0:
        assert time.monotonic() < deadline, "queued work was not dropped"
        time.sleep(0.05)
    time.sleep(0.5)  # the window in flight finishes
    computed = served.metric("embedcache_sequences_computed_total", "bert") - before
    assert 0 < computed < len(seqs)
    assert served.metric("embedcache_queue_sequences", "bert") == 0
    # what was computed is stored: asking again computes only the rest
    reply = embed(served, "bert", seqs).json()
    assert reply["n_cached"] == computed
    assert reply["n_computed"] == len(seqs) - computed
