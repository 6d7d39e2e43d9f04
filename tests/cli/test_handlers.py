"""Each handler is one package call plus printing; only the CLI reads the environment."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import numpy as np
import pytest

import embedcache
from embedcache.cli import embed as cli_embed
from embedcache.cli import export as cli_export
from embedcache.cli import main
from embedcache.cli import report as cli_report
from embedcache.engine.plan import EmbedResult
from embedcache.specs import ModelKey
from tests.engine.helpers import write_small_version

PACKAGE = Path(embedcache.__file__).parent


def key(layer):
    return ModelKey(
        model_id="fake",
        revision="f" * 40,
        adapter="t",
        adapter_version="1",
        layer=layer,
    )


@pytest.fixture
def calls(monkeypatch):
    """Record every embed_into_store call; answer with zero vectors."""
    seen = []

    def fake(model, seqs, store, **kwargs):
        seen.append({"model": model, "seqs": list(seqs), "store": store, **kwargs})
        layers = kwargs["options"]["layers"]
        keys = tuple(key(int(x)) for x in layers.split(",")) if layers else (key(-1),)
        vectors = np.zeros((len(seqs), 4), dtype=np.float32)
        return EmbedResult(vectors, n_computed=len(seqs), n_cached=0, keys=keys)

    monkeypatch.setattr("embedcache.engine.api.embed_into_store", fake)
    return seen


def test_embed_makes_one_engine_call_with_the_strings_given(calls, tmp_path, capsys):
    (tmp_path / "in.fa").write_text(">a\nACGT\n>b\nGGCA\n")
    args = ["embed", "--model", "org/some-model", "--input", str(tmp_path / "in.fa")]
    args += ["--output", str(tmp_path / "o.npy"), "--store", str(tmp_path / "s")]
    args += ["--layers", "3,1", "--family-option", "k=v", "--cluster", "none"]
    assert main(args) == 0
    [call] = calls
    assert call["model"] == "org/some-model"
    assert call["seqs"] == ["ACGT", "GGCA"]
    assert call["names"] == ["record 'a' (line 1)", "record 'b' (line 3)"]
    assert call["store"] == str(tmp_path / "s")
    assert call["cluster"] == "none"
    options = call["options"]
    assert (options["layers"], options["layer"]) == ("3,1", -1)  # parsed by the engine
    assert options["family_options"] == (("k", "v"),)
    assert np.load(tmp_path / "o.npy").shape == (2, 4)
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"wrote 2 x 4 float32 to {tmp_path / 'o.npy'}",
        f"{tmp_path / 'o.npy'} holds layer 3; layers [3, 1] are stored",
        "computed=2 cached=0",
    ]


def test_embeddings_makes_one_engine_call(calls, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("EMBEDCACHE_STORE", str(tmp_path / "env-store"))
    version = write_small_version(tmp_path / "small-demo.toml")
    args = ["embeddings", "--model", "kmer-3", "--version", str(version)]
    assert main(args) == 0
    [call] = calls
    assert call["model"] == "kmer-3"
    assert call["store"] == str(tmp_path / "env-store")
    assert len(call["seqs"]) == len(call["names"]) == 100
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("small-demo (subset ")
    assert out[0].endswith("): 100 items embedded with kmer-3")
    assert out[-1] == "computed=100 cached=0"


FORBIDDEN = (
    "read_sequences",
    "load_adapter",
    "layer_count",
    "EmbeddingStore",
    "embed_sequences",
    "embed_on_cluster",
    "open_cluster",
    "draw_version",
    "load_version",
    "read_csv",
    "np.save",
    ".open(",
    "read_text",
)


@pytest.mark.parametrize("module", [cli_embed, cli_export, cli_report])
def test_handlers_leave_files_models_stores_and_clusters_to_the_package(module):
    source = inspect.getsource(module)
    assert [name for name in FORBIDDEN if name in source] == []


# Process-wide switches that, like numba's own NUMBA_* variables, must reach code far
# below the command line and every process a run starts: each module reads its one
# variable, named here, and nothing else of the environment.
PROCESS_SWITCHES = {
    "models/shared/cpu_features.py": "EMBEDCACHE_CPU_KIND",  # tests and CI only
    "models/shared/tuning.py": "EMBEDCACHE_TUNE",  # the kernel tuner's override
}


def test_only_the_cli_reads_the_environment():
    readers = re.compile(r"os\.environ|os\.getenv|getenv\(")
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "cli" not in path.relative_to(PACKAGE).parts
        and readers.search(path.read_text())
    ]
    assert sorted(offenders) == sorted(PROCESS_SWITCHES)
    for module, variable in PROCESS_SWITCHES.items():
        text = (PACKAGE / module).read_text()
        assert variable in text, module
        # the variable's own read, and the numba cache folder the CLI also sets
        reads = re.findall(r"os\.environ(?:\.get\(([A-Z_]+))?", text)
        assert set(reads) <= {"", "ENV_VAR", "FORCED_KIND_VAR"}, (module, reads)


def test_report_prints_the_package_summary(tmp_path, capsys, monkeypatch):
    from embedcache.report.render import ReportPaths

    out = tmp_path / "reports" / "demo-v1"
    out.mkdir(parents=True)
    (out / "results.csv").write_text(
        "dataset,metric,model,value,ci_low,ci_high,n,is_floor\n"
        "mean,accuracy,kmer-2,0.61,0.55,0.66,600,true\n"
        "mean,accuracy,org/m,0.7234,0.701,0.745,600,false\n"
        "mean,macro_f1,org/m,0.7,0.6,0.8,600,false\n"
    )
    paths = ReportPaths(
        out / "leaderboard.ipynb", out / "index.html", out / "results.csv"
    )
    seen = []

    def fake_render(version, **kwargs):
        seen.append((version, kwargs))
        return paths

    monkeypatch.setattr("embedcache.report.render.render_report", fake_render)
    args = ["report", "--version", "demo-v1", "--store", str(tmp_path / "s")]
    assert main([*args, "--n-boot", "10"]) == 0
    assert len(seen) == 1
    assert seen[0][1]["n_boot"] == 10
    assert capsys.readouterr().out.splitlines() == [
        "demo-v1 (not comparable to the leaderboard): mean accuracy [95% CI], n",
        f"  {'org/m':<40} 0.723 [0.701, 0.745] n=600",
        f"  {'kmer-2':<40} 0.610 [0.550, 0.660] n=600 (floor)",
        f"notebook: {paths.notebook}",
        f"results:  {paths.results}",
        f"report:   {paths.html}",
    ]


def test_demo_runs_its_steps_through_the_whole_command_line(
    monkeypatch, capsys, tmp_path
):
    from embedcache.cli import report as cli_report

    steps = [["versions"], ["models"]]
    monkeypatch.setattr(cli_report, "_demo_steps", lambda *args: steps)
    assert main(["demo", "--store", str(tmp_path / "store")]) == 0
    out = capsys.readouterr().out
    assert "$ embedcache versions" in out
    assert "$ embedcache models" in out
    assert "demo-v1" in out.splitlines()[-1]
