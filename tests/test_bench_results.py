"""gatednorm.bench.results: a run updates the per-GPU results file case by case."""

import json
from pathlib import Path

import pytest
import torch

from gatednorm.bench import results


def _run(date: str, cases: dict[str, str], tree: str = "abc") -> dict:
    """A one-run result: ``cases`` maps case name -> status of its one record."""
    header = {"gpu": "NVIDIA H200", "torch": "2.11", "triton": "3.6", "gatednorm": "0.1.0",
              "date": date, "command": f"python -m gatednorm.bench # {date}", "copy_gbps": 4200.0,
              "git_commit": tree, "cases": [{"case": c} for c in cases]}
    reason = {"skipped": "not reached within --budget-s 330"}
    records = [{"case": c, "provider": "gatednorm", "pass": "fwd", "status": status,
                "error": reason.get(status), "median_ms": 1.0} for c, status in cases.items()]
    copies = [{"case": c, "pass": "fwd"} for c, status in cases.items() if status == "ok"]
    return results.single_run(header, records, copies, [])


def test_a_run_replaces_the_cases_it_measured_and_keeps_the_others():
    old = _run("day1", {"a": "ok", "b": "ok", "c": "ok"}, tree="t1")
    new = _run("day2", {"b": "ok", "c": "skipped", "d": "ok"}, tree="t2")
    merged = results.merge(old, new)
    by_case = {c["case"]: c["run"] for c in merged["cases"]}
    assert by_case == {"a": "day1", "b": "day2", "c": "day1", "d": "day2"}
    # c was not reached by the new run: its old record stays, the placeholder does not.
    assert [r["status"] for r in merged["records"] if r["case"] == "c"] == ["ok"]
    assert [r["run"] for r in merged["runs"]] == ["day1", "day2"]
    assert {r["run"]: r["tree"] for r in merged["runs"]} == {"day1": "t1", "day2": "t2"}
    assert sorted(e["case"] for e in merged["same_bytes_copy"]) == ["a", "b", "c", "d"]
    assert merged["date"] == "day2" and merged["command"].endswith("day2")


def test_runs_that_no_case_points_at_are_dropped():
    first = _run("day1", {"a": "ok"})
    second = _run("day2", {"a": "ok", "b": "ok"})
    merged = results.merge(first, second)
    assert [r["run"] for r in merged["runs"]] == ["day2"]
    assert len(merged["records"]) == 2


def test_a_run_keeps_the_quantized_section_of_the_file():
    old = {**_run("day1", {"a": "ok"}), results.QUANTIZED: {"date": "day0", "records": []}}
    merged = results.merge(old, _run("day2", {"a": "ok"}))
    assert merged[results.QUANTIZED] == {"date": "day0", "records": []}


def test_a_quantized_run_on_a_gpu_fills_the_section_of_its_results_file(tmp_path, monkeypatch):
    from gatednorm.bench import quantized

    monkeypatch.chdir(tmp_path)
    main_run = _run("day1", {"a": "ok"})
    path = results.default_path("NVIDIA H200")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(main_run))
    run = {"gpu": "NVIDIA H200", "records": [{"case": "gdn"}]}
    written = quantized._write(run, None, torch.device("cuda"), partial=False)
    stored = results.load(written)
    assert written == path and stored[results.QUANTIZED] == run
    assert stored["records"] == main_run["records"]
    # Smoke and --cases runs never touch the results file.
    elsewhere = quantized._write(run, None, torch.device("cuda"), partial=True)
    assert elsewhere != path and results.load(path) == stored


def test_where_a_run_writes(tmp_path):
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert results.output_path(cuda, "full", "NVIDIA H200", False)[:2] == (
        Path("benchmarks/results/h200.json"), True)
    for device, mode, some in ((cuda, "quick", False), (cuda, "full", True), (cpu, "full", False),
                               (cpu, "smoke", False)):
        path, update, why = results.output_path(device, mode, "NVIDIA H200", some)
        assert not update and "benchmarks/results" not in str(path.parent) and why


def test_a_file_of_another_format_is_refused(tmp_path):
    path = tmp_path / "h200.json"
    path.write_text('{"gpu": "NVIDIA H200"}')
    with pytest.raises(ValueError, match="--out"):
        results.load(path)


def test_a_run_says_which_gatednorm_path_it_times(monkeypatch):
    from gatednorm.bench.__main__ import _subject_path

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert _subject_path(torch.device("cpu")) == "Triton kernels through Triton's interpreter"
    assert _subject_path(torch.device("cuda", 0)) == "Triton kernels"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert "eager reference composite" in _subject_path(torch.device("cpu"))
