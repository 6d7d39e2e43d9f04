"""``--dtype bfloat16`` on a CPU without bf16 instructions: one warning, same key."""

from __future__ import annotations

import logging

import pytest

from embedcache.models import load_adapter
from embedcache.models.shared import cpu_features

pytestmark = pytest.mark.cpu_kind

FLAGS = "fpu vme sse sse2 avx avx2 fma"


@pytest.fixture
def probe(monkeypatch):
    """Set what the CPU-feature probe answers; forget earlier warnings."""
    monkeypatch.setattr(cpu_features, "_warned", set())

    def answer(value):
        monkeypatch.setattr(cpu_features, "cpu_has_bf16", lambda: value)

    return answer


@pytest.mark.parametrize("flags", [FLAGS, f"{FLAGS} avx512_bf16", f"{FLAGS} amx_bf16"])
def test_cpu_flags_reads_the_first_flags_line(tmp_path, flags):
    info = tmp_path / "cpuinfo"
    info.write_text(
        f"processor\t: 0\nmodel name\t: X\nflags\t\t: {flags}\n\nflags : z\n"
    )
    found = cpu_features.cpu_flags(info)
    assert found == frozenset(flags.split())
    assert bool(found & cpu_features.BF16_FLAGS) == ("bf16" in flags)


def test_unreadable_cpuinfo_means_unknown(tmp_path):
    assert cpu_features.cpu_flags(tmp_path / "absent") is None


def test_bf16_without_bf16_instructions_warns_once_and_keeps_the_key(
    probe, tiny_bert_dir, caplog
):
    probe(False)
    with caplog.at_level(
        logging.WARNING, logger="embedcache.models.shared.cpu_features"
    ):
        first = load_adapter(str(tiny_bert_dir), dtype="bfloat16", device="cpu")
        second = load_adapter(str(tiny_bert_dir), dtype="bfloat16", device="cpu")
    warned = [r for r in caplog.records if "float32 will be" in r.getMessage()]
    assert len(warned) == 1
    assert str(tiny_bert_dir) in warned[0].getMessage()
    assert first.key.dtype == second.key.dtype == "bfloat16"


@pytest.mark.parametrize(
    ("has_bf16", "dtype", "device"),
    [
        (True, "bfloat16", "cpu"),
        (None, "bfloat16", "cpu"),
        (False, "float32", "cpu"),
        (False, "bfloat16", "cuda:0"),
    ],
)
def test_no_warning_where_bf16_is_not_slow(probe, caplog, has_bf16, dtype, device):
    probe(has_bf16)
    with caplog.at_level(logging.WARNING):
        applies = cpu_features.warn_if_bf16_is_slow(dtype, device, model="m")
    assert not applies
    assert not caplog.records


def test_float32_load_on_a_cpu_without_bf16_says_nothing(probe, tiny_bert_dir, caplog):
    probe(False)
    with caplog.at_level(
        logging.WARNING, logger="embedcache.models.shared.cpu_features"
    ):
        adapter = load_adapter(str(tiny_bert_dir), dtype="float32", device="cpu")
    assert adapter.key.dtype == "float32"
    assert not caplog.records


@pytest.mark.parametrize(
    ("flags", "kind"),
    [
        (f"{FLAGS} avx512f avx512_bf16 amx_bf16 amx_tile", "AMX"),
        (f"{FLAGS} avx512f avx512_bf16", "AVX-512 BF16"),
        (f"{FLAGS} avx512f", "AVX-512"),
        (FLAGS, "AVX2"),
        ("fpu sse sse2", "unknown"),
    ],
)
def test_cpu_kind_is_named_by_its_best_flag(flags, kind):
    assert cpu_features.kind_of(frozenset(flags.split())) == kind


def test_cpu_kind_of_unreadable_flags_is_unknown():
    assert cpu_features.kind_of(None) == "unknown"


@pytest.mark.parametrize(
    ("has_bf16", "dtype"), [(True, "bfloat16"), (False, "float32"), (None, "float32")]
)
def test_auto_dtype_is_recorded_resolved_in_the_key(
    probe, tiny_bert_dir, has_bf16, dtype
):
    probe(has_bf16)
    adapter = load_adapter(str(tiny_bert_dir), dtype="auto", device="cpu")
    assert adapter.key.dtype == dtype
    asked = load_adapter(str(tiny_bert_dir), dtype=dtype, device="cpu")
    assert adapter.key.digest == asked.key.digest


def test_auto_dtype_leaves_the_floors_exact(probe):
    probe(True)
    assert load_adapter("kmer-4", dtype="auto").key.dtype == "float32"


def test_explicit_dtypes_are_kept_whatever_the_cpu(probe):
    probe(True)
    assert cpu_features.resolve_dtype("float32", "cpu") == "float32"
    probe(False)
    assert cpu_features.resolve_dtype("bfloat16", "cpu") == "bfloat16"
    assert cpu_features.resolve_dtype("auto", "cpu") == "float32"


@pytest.mark.parametrize(
    ("kind", "auto"),
    [("AVX2", "float32"), ("AVX-512 BF16", "bfloat16"), ("AMX", "bfloat16")],
)
def test_models_command_names_the_cpu_kind_and_what_auto_resolves_to(
    monkeypatch, capsys, kind, auto
):
    from embedcache.cli import main

    monkeypatch.setenv(cpu_features.FORCED_KIND_VAR, kind)
    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    (machine,) = [line for line in lines if line.startswith("this machine:")]
    assert f"CPU kind {kind};" in machine
    assert f"--dtype auto computes in {auto}" in machine


@pytest.mark.parametrize("kind", cpu_features.KINDS)
def test_forced_kind_decides_auto_and_the_report(monkeypatch, kind):
    monkeypatch.setenv(cpu_features.FORCED_KIND_VAR, kind)
    assert cpu_features.cpu_kind() == kind
    bf16 = kind in ("AMX", "AVX-512 BF16")
    assert cpu_features.cpu_has_bf16() is bf16
    resolved = "bfloat16" if bf16 else "float32"
    assert cpu_features.resolve_dtype("auto", "cpu") == resolved
    described = cpu_features.describe_auto("cpu")
    assert f"CPU kind {kind}, forced by EMBEDCACHE_CPU_KIND" in described


def test_unforced_kind_is_the_detected_one(monkeypatch):
    monkeypatch.delenv(cpu_features.FORCED_KIND_VAR, raising=False)
    assert cpu_features.cpu_kind() == cpu_features.kind_of(cpu_features.cpu_flags())
    assert "forced" not in cpu_features.describe_auto("cpu")


def test_forced_kind_reaches_a_subprocess(monkeypatch):
    """The CI-style run: a command the suite starts sees the forced kind too."""
    from tests.cli.helpers import run_cli

    monkeypatch.setenv(cpu_features.FORCED_KIND_VAR, "AMX")
    done = run_cli(["models"])
    assert done.returncode == 0, done.stderr
    assert "CPU kind AMX; --dtype auto computes in bfloat16" in done.stdout


def test_a_forced_kind_that_names_no_kind_is_refused(monkeypatch):
    from embedcache.errors import AdapterOptionError

    monkeypatch.setenv(cpu_features.FORCED_KIND_VAR, "avx512")
    with pytest.raises(AdapterOptionError, match="'avx512' names no CPU kind"):
        cpu_features.cpu_kind()
