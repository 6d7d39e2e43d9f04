"""``--dtype bfloat16`` on a CPU without bf16 instructions: one warning, same key."""

from __future__ import annotations

import logging

import pytest

from embedcache.models import load_adapter
from embedcache.models.shared import cpu_features

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
