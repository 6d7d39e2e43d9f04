"""The benchmark harness, its record writer and the page built from the records
(no benchmark is run here)."""

from __future__ import annotations

import json

import pytest

from benchmarks.__main__ import discover
from benchmarks.__main__ import main as harness
from benchmarks.records import Figure, RecordError, load_records, record
from benchmarks.report import render_benchmarks_page, write_history_plot

PEAKS = {"float32": 101.23e9, "bfloat16": 402.5e9, "best": 402.5e9}


def a_record(tmp_path, name="serve_bench", value=0.95, **kw):
    figures = {
        "(a) served / in-process": Figure(value, "x", ">= 0.9"),
        "tokens/s": Figure(1234, "tokens/s"),
    }
    path = record(name, figures, quick=True, peaks=PEAKS, results=tmp_path, **kw)
    return json.loads(path.read_text().splitlines()[-1])


@pytest.mark.parametrize(
    ("value", "target", "meets"),
    [(0.95, ">= 0.9", True), (0.85, ">= 0.9", False), (19.9, "< 20", True),
     (20.0, "< 20", False), (3.0, None, None), (20_001, ">= 20,000", True)],
)  # fmt: skip
def test_figure_meets_its_target(value, target, meets):
    assert Figure(value, "", target).meets() is meets


@pytest.mark.parametrize("target", ["0.9", "=> 0.9", ">= fast", ">=0.9"])
def test_a_malformed_target_is_refused_naming_it(tmp_path, target):
    with pytest.raises(RecordError, match=target):
        record("b", {"f": Figure(1.0, "", target)}, quick=True, peaks=PEAKS,
               results=tmp_path)  # fmt: skip
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_a_figure_must_be_a_figure(tmp_path):
    with pytest.raises(RecordError, match="'f' of b"):
        record("b", {"f": 1.0}, quick=True, peaks=PEAKS, results=tmp_path)


def test_record_appends_one_line_naming_the_machine_and_run(tmp_path):
    first = a_record(tmp_path, argv=["--quick"])
    second = a_record(tmp_path, value=0.5, argv=["--quick"])
    lines = (tmp_path / "serve_bench.jsonl").read_text().splitlines()
    assert len(lines) == 2
    assert first["figures"]["(a) served / in-process"]["value"] == 0.95
    assert second["figures"]["(a) served / in-process"] == {
        "value": 0.5, "unit": "x", "target": ">= 0.9"
    }  # fmt: skip
    assert second["peaks_gflops"] == {"float32": 101.2, "bfloat16": 402.5}
    assert len(second["load_average"]) == 3
    assert second["cpu_kind"]
    assert second["commit"] != "unknown"
    assert second["argv"] == ["--quick"]
    assert second["quick"] is True
    assert second["date"].endswith("+00:00")


def test_load_records_sorts_by_date_and_names_a_bad_line(tmp_path):
    a_record(tmp_path, name="b_bench")
    a_record(tmp_path, name="a_bench")
    dates = [r["date"] for r in load_records(tmp_path)]
    assert dates == sorted(dates)
    assert len(dates) == 2
    (tmp_path / "c_bench.jsonl").write_text('{"date": "x"}\n{broken\n')
    with pytest.raises(json.JSONDecodeError) as err:
        load_records(tmp_path)
    assert "c_bench.jsonl, line 2" in str(err.value.__notes__)


def test_the_page_shows_the_latest_record_per_cpu_kind_beside_targets(tmp_path):
    old = a_record(tmp_path, value=0.5)
    new = a_record(tmp_path, value=0.97, argv=["--quick"])
    other = {**old, "cpu_kind": "AVX2", "date": "2020-01-01T00:00:00+00:00"}
    page = render_benchmarks_page([old, new, other])
    assert page.count("### serve_bench on ") == 2
    assert f"### serve_bench on {new['cpu_kind']}" in page
    assert "| (a) served / in-process | 0.97 x | >= 0.9 | meets |" in page
    assert "0.5 x" in page  # the AVX2 record's (it is the only one there)
    assert "| tokens/s | 1,234 tokens/s |  |  |" in page
    assert "`python -m benchmarks run serve_bench --quick`" in page
    assert "load average" in page
    assert "![benchmark history](benchmarks-history.svg)" in page
    below = render_benchmarks_page([old])
    assert "| (a) served / in-process | 0.5 x | >= 0.9 | **below** |" in below


def test_the_page_without_records_says_so():
    page = render_benchmarks_page([])
    assert "No records yet." in page
    assert "![" not in page


def test_the_history_plot_has_a_panel_per_benchmark(tmp_path):
    results = tmp_path / "results"
    a_record(results)
    a_record(results, name="scale_bench")
    svg = write_history_plot(load_records(results), tmp_path / "h.svg").read_text()
    assert "<svg" in svg
    assert "scale_bench" in svg
    assert "serve_bench" in svg
    png = write_history_plot([], tmp_path / "empty.png")
    assert png.read_bytes().startswith(b"\x89PNG")


def test_the_harness_lists_benchmarks_by_their_main_and_docstring(tmp_path, capsys):
    found = discover()
    for name in ("embed_bench", "caduceus_bench", "hyena_bench", "scale_bench",
                 "serve_bench", "profile_families", "many_writers_bench"):  # fmt: skip
        assert name in found
    assert not {"common", "records", "report", "shapes", "__main__"} & set(found)
    (tmp_path / "x_bench.py").write_text(
        '"""Times x.\n\nMore."""\ndef main(argv):\n    pass\n'
    )
    (tmp_path / "helper.py").write_text('"""A helper."""\ndef main():\n    pass\n')
    assert discover(tmp_path) == {"x_bench": "Times x."}
    assert harness(["list"]) == 0
    assert "embed_bench" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        harness(["run", "no_such"])
    assert "no benchmark 'no_such'" in capsys.readouterr().err
