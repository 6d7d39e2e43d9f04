"""`embedcache store ...` and `embedcache embed --store URL` on a folder and on S3."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from embedcache.cli import main
from embedcache.specs import ModelKey

REPO = Path(__file__).resolve().parents[2]
KEY = ModelKey(model_id="m/cli", revision="c" * 40, adapter="t", adapter_version="1")


def hashes_of(n: int, prefix: str) -> list[str]:
    return [hashlib.sha256(f"{prefix}{i}".encode()).hexdigest() for i in range(n)]


@pytest.fixture
def cli_env(monkeypatch):
    """Point the CLI at a handle: S3 credentials and endpoint through the environment."""

    def apply(handle):
        for name, value in (handle.options or {}).items():
            monkeypatch.setenv(name.upper(), value)
        return str(handle.root)

    return apply


def test_store_commands_on_a_folder_and_on_s3(process_handle, cli_env, capsys):
    location = cli_env(process_handle)
    store = process_handle.open(auto_merge=0)
    for i in range(3):
        vectors = np.random.default_rng(i).standard_normal((10, 4)).astype(np.float32)
        kernels = {"cpu_kind": "AMX", "attention <=128": "math"} if i else None
        store.put(
            KEY, hashes_of(10, f"{i}-"), vectors, alias=f"copy-{i % 2}", kernels=kernels
        )
    assert main(["store", "ls", "--store", location]) == 0
    out = capsys.readouterr().out
    assert KEY.digest[:12] in out
    assert "30" in out
    assert "aka copy-0, copy-1" in out
    assert main(["store", "info", "--store", location]) == 0
    out = capsys.readouterr().out
    assert KEY.canonical_json() in out
    assert "aliases: copy-0, copy-1" in out
    # the kernels that computed the vectors, as the commits recorded them
    assert '{"attention <=128": "math", "cpu_kind": "AMX"}' in out
    assert main(["store", "verify", "--store", location]) == 0
    assert main(["store", "compact", "--store", location]) == 0
    (merged,) = process_handle.open()._view(KEY).runs  # the rest wait for their grace
    assert main(["store", "migrate", "--store", location]) == 0
    assert "nothing to do" in capsys.readouterr().out
    # damage: verify exits non-zero and names the object
    chunk = f"{KEY.digest}/shards/{merged.record.run}/vectors/c/0/0"
    process_handle.write(chunk, process_handle.read(chunk)[:-3])
    assert main(["store", "verify", "--store", location]) == 1
    assert process_handle.location(chunk) in capsys.readouterr().out
    assert main(["store", "ls", "--store", f"{location}-absent"]) == 2


@pytest.mark.cpu_kind
def test_embed_on_s3_caches_and_equals_the_local_store(
    s3_handle, cli_env, tiny_bert_dir, tmp_path, capsys
):
    rng = np.random.default_rng(5)
    seqs = [
        "".join(rng.choice(list("ACGT"), size=int(n))) for n in rng.integers(8, 40, 24)
    ]
    (tmp_path / "in.txt").write_text("\n".join(seqs) + "\n")
    url = cli_env(s3_handle)
    base = ["embed", "--model", str(tiny_bert_dir), "--input", str(tmp_path / "in.txt")]
    base += ["--device", "cpu", "--no-progress"]
    assert main([*base, "--store", url, "--output", str(tmp_path / "s3.npy")]) == 0
    assert capsys.readouterr().out.strip().endswith("computed=24 cached=0")
    assert main([*base, "--store", url, "--output", str(tmp_path / "again.npy")]) == 0
    assert capsys.readouterr().out.strip().endswith("computed=0 cached=24")
    local = str(tmp_path / "local-store")
    assert main([*base, "--store", local, "--output", str(tmp_path / "local.npy")]) == 0
    s3, again = np.load(tmp_path / "s3.npy"), np.load(tmp_path / "again.npy")
    np.testing.assert_array_equal(s3, again)
    np.testing.assert_array_equal(s3, np.load(tmp_path / "local.npy"))
    assert main(["store", "verify", "--store", url]) == 0


# not slow: it caught two writers creating one store at once (the second refused it)
@pytest.mark.cpu_kind
def test_two_embed_processes_on_one_s3_store_lose_nothing(
    s3_handle, cli_env, tiny_bert_dir, tmp_path, capsys
):
    url = cli_env(s3_handle)
    rng = np.random.default_rng(6)
    more = ["".join(rng.choice(list("ACGT"), size=30)) for _ in range(40)]
    inputs = [more[:28], more[12:]]
    procs = []
    for i, part in enumerate(inputs):
        (tmp_path / f"w{i}.txt").write_text("\n".join(part) + "\n")
        args = ["embed", "--model", str(tiny_bert_dir), "--device", "cpu"]
        args += ["--input", str(tmp_path / f"w{i}.txt"), "--no-progress"]
        args += ["--store", url, "--output", str(tmp_path / f"w{i}.npy")]
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "embedcache.cli", *args],
                cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO)},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(
        o[1][-3000:] for o in outs
    )
    # the union of both is stored: a third run computes nothing
    (tmp_path / "all.txt").write_text("\n".join(more) + "\n")
    capsys.readouterr()
    args = ["embed", "--model", str(tiny_bert_dir), "--device", "cpu", "--no-progress"]
    args += ["--input", str(tmp_path / "all.txt"), "--store", url]
    assert main([*args, "--output", str(tmp_path / "all.npy")]) == 0
    assert capsys.readouterr().out.strip().endswith("computed=0 cached=40")
    together = np.load(tmp_path / "all.npy")
    np.testing.assert_array_equal(together[:28], np.load(tmp_path / "w0.npy"))
    np.testing.assert_array_equal(together[12:], np.load(tmp_path / "w1.npy"))
    assert main(["store", "verify", "--store", url]) == 0


def test_store_options_come_from_the_given_environment():
    from embedcache.store.options import storage_options

    environ = {
        "AWS_REGION": "eu-west-1",
        "AWS_ALLOW_HTTP": "true",
        "AZURE_STORAGE_ACCOUNT_NAME": "acct",
        "AWS_PROFILE": "unused",  # not a store option
    }
    assert storage_options("s3://bucket/prefix", environ) == {
        "aws_region": "eu-west-1",
        "aws_allow_http": "true",
    }
    assert storage_options("az://container/p", environ) == {
        "azure_storage_account_name": "acct"
    }
    assert storage_options("store", environ) == {}
    assert storage_options("memory://", environ) == {}


def test_only_the_cli_reads_the_environment(monkeypatch):
    from embedcache.cli.common import store_options

    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "acct")
    monkeypatch.setenv("AWS_PROFILE", "unused")  # not a store option
    assert store_options("s3://bucket/prefix") == {
        "aws_region": "eu-west-1",
        "aws_allow_http": "true",
    }
    assert store_options("az://container/p") == {"azure_storage_account_name": "acct"}
    assert store_options("store") == {}
    assert store_options("memory://") == {}
