"""One model name, one key, on every replica: a ``--model`` flag and a ``[[model]]``
table of serve.toml resolve the same options (float32 unless pinned otherwise), and
/v1/models shows each model's key digest and resolved dtype (issue 42, finding 6)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx

from embedcache.service import wire
from tests.service.conftest import Server


def test_three_replicas_configured_three_ways_report_one_key_per_name(
    tmp_path, tiny_bert_dir
):
    tables = tmp_path / "serve.toml"
    tables.write_text(
        f'[[model]]\nmodel = "{tiny_bert_dir}"\nname = "bert"\n'
        '[[model]]\nmodel = "kmer-4"\n'
    )
    mixed = tmp_path / "mixed.toml"
    mixed.write_text('[[model]]\nmodel = "kmer-4"\n')
    common = ["--store", tmp_path / "store", "--threads", "1"]
    ways = [
        [*common, "--model", f"bert={tiny_bert_dir}", "--model", "kmer-4"],
        [*common, "--config", tables],
        [*common, "--config", mixed, "--model", f"bert={tiny_bert_dir}"],
    ]
    with ThreadPoolExecutor(len(ways)) as pool:
        replicas = list(
            pool.map(
                lambda i: Server(
                    ways[i], log_path=tmp_path / f"replica-{i}.log", ready_s=240
                ),
                range(len(ways)),
            )
        )
    try:
        listed = [
            httpx.get(r.url + wire.ROUTE_MODELS, timeout=30).json()["data"]
            for r in replicas
        ]
    finally:
        for replica in replicas:
            assert replica.stop() == 0, replica.log()
    by_name = {}
    for models in listed:
        assert {m["id"] for m in models} == {"bert", "kmer-4"}
        for m in models:
            by_name.setdefault(m["id"], set()).add(m["key_digest"])
    assert all(len(digests) == 1 for digests in by_name.values()), by_name
    for models in listed:
        for m in models:
            assert m["dtype"] == m["key"]["dtype"]
            if m["id"] == "bert":
                assert m["dtype"] == "float32"  # the explicit default on any CPU
