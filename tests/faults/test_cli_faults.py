"""The command line through the flaky object store: `embed`, `store verify`, `store
compact` complete through transient faults, or fail with one error line naming the
store and the operation."""

from __future__ import annotations

import numpy as np

from embedcache.cli import main
from tests.faults.test_object_store import seqs_of


def use_env(monkeypatch, handle) -> str:
    for name, value in (handle.options or {}).items():
        monkeypatch.setenv(name.upper(), value)
    return str(handle.root)


def test_cli_embed_verify_compact_through_faults(
    faulty, proxy, monkeypatch, tmp_path, capsys
):
    through, direct = faulty
    through.options = {  # as a user sets them: environment variables only
        k: v for k, v in through.options.items() if not k.endswith("backoff")
    }
    url = use_env(monkeypatch, through)
    seqs = tmp_path / "seqs.txt"
    seqs.write_text("\n".join(seqs_of(120, seed=3)) + "\n")
    embed = ["embed", "--model", "kmer-3", "--input", str(seqs), "--store", url]
    proxy.inject(rate=0.15, kinds=("refuse", "500", "503", "reset"))
    assert main([*embed, "--output", str(tmp_path / "a.npy")]) == 0
    assert main(["store", "verify", "--store", url]) == 0
    assert main(["store", "compact", "--store", url]) == 0
    assert main([*embed, "--output", str(tmp_path / "b.npy")]) == 0
    faults = proxy.n_faults
    proxy.calm()
    assert faults >= 5, dict(proxy.counts)
    assert "computed=0 cached=120" in capsys.readouterr().out
    np.testing.assert_array_equal(
        np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy")
    )
    fresh = direct.open()
    assert (fresh.keys()[0].n_vectors, fresh.keys()[0].n_runs) == (120, 1)
    assert fresh.garbage() == []
    # every PUT refused from now on: one clear error line, exit status 2
    proxy.inject(rate=1.0, kinds=("503",), method="PUT")
    more = tmp_path / "more.txt"
    more.write_text("\n".join(seqs_of(10, seed=4)) + "\n")
    code = main(
        [
            *embed[:-4],
            "--input",
            str(more),
            "--store",
            url,
            "--output",
            str(tmp_path / "c.npy"),
        ]
    )
    proxy.calm()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith("embedcache: error: the object store " + url)
    assert "while writing" in err[-1] or "while committing" in err[-1]
    assert proxy.counts["503"] > 1
