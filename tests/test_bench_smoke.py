"""`python -m gatednorm.bench --smoke` runs every provider, case family and pass on CPU and
writes its results in the documented schema.

The run is a subprocess with TRITON_INTERPRET=0: gatednorm takes its eager reference path on
CPU, which keeps the test at about 20 s; what is tested here is the benchmark (cases, inputs,
oracle and checks, timing loops, records, report), not the kernels (the kernel suites cover
those).
"""

import json
import os
import subprocess
import sys

import pytest

from gatednorm.bench import cases, providers

TOP_LEVEL = {"format": str, "gpu": str, "torch": str, "triton": str, "gatednorm": str,
             "date": str, "command": str, "copy_gbps": float, "records": list,
             "providers": list, "cases": list, "first_calls": list, "runs": list}
RECORD_KEYS = {"provider", "case", "rows", "d", "dtype", "gate_layout", "pass", "median_ms",
               "gbps", "frac_copy", "status", "error", "group_size", "norm_before_gate",
               "activation"}
STATUSES = {"ok", "wrong", "error", "n/a", "missing", "skipped"}
# Peers that need a GPU (FLA's autotuner needs a driver): on CPU they may be missing or fail.
GPU_ONLY = {"fla", "fla-mamba"}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "smoke.json"
    env = dict(os.environ, TRITON_INTERPRET="0", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "gatednorm.bench", "--smoke", "--no-plot", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {**json.loads(out.read_text()), "__path__": str(out)}, proc


def test_top_level_fields(smoke):
    result, _ = smoke
    for key, kind in TOP_LEVEL.items():
        assert isinstance(result[key], kind), key
    assert result["copy_gbps"] > 0
    assert result["command"].startswith("python -m gatednorm.bench --smoke")
    assert {p["name"] for p in result["providers"]} == {p.name for p in providers.PROVIDERS}
    # Written after every case with complete=False; the finished run says True.
    assert result["complete"] is True
    # One run, and every case points at it.
    (run,) = result["runs"]
    assert run["run"] == result["date"] and run["command"] == result["command"]
    assert {c["run"] for c in result["cases"]} == {run["run"]}


def test_says_what_it_times_and_where_it_wrote(smoke):
    result, proc = smoke
    assert "gatednorm runs its eager reference composite" in proc.stderr
    assert "set TRITON_INTERPRET=1" in proc.stderr
    assert result["subject_path"].startswith("its eager reference composite")
    assert f"results: {result['__path__']}" in proc.stderr
    assert f"wrote {result['__path__']}" in proc.stdout
    # CPU runs print times, not bandwidth (tiny shapes would show 0 GB/s).
    assert "no bandwidth figures" in proc.stdout
    assert "GB/s" not in proc.stdout
    if providers.fla_version() is None:
        assert "pip install fla-core" in proc.stderr
        assert "pip install fla-core" in proc.stdout


def test_records_have_the_schema(smoke):
    result, _ = smoke
    for record in result["records"]:
        assert RECORD_KEYS <= record.keys(), record
        assert record["status"] in STATUSES, record
        assert record["pass"] in cases.PASSES, record
        if record["status"] in ("ok", "wrong"):
            assert record["median_ms"] > 0 and record["gbps"] > 0 and record["frac_copy"] > 0
            assert record["max_abs_err"] >= 0
        else:
            assert record["median_ms"] is None and record["error"], record


def test_every_provider_appears_on_every_case(smoke):
    """No provider is silently dropped: each case has one record per pass (training) or per
    mode (decode) for every provider, whatever its status."""
    result, _ = smoke
    names = {p.name for p in providers.PROVIDERS}
    for case in cases.smoke_cases():
        mine = [r for r in result["records"] if r["case"] == case.name]
        assert {r["provider"] for r in mine} == names, case.name
        for name in names:
            theirs = [r for r in mine if r["provider"] == name]
            if case.is_decode:
                assert sorted(r["mode"] for r in theirs) == ["eager", "graph"]
                assert all(r["pass"] == "fwd" for r in theirs)
            else:
                assert sorted(r["pass"] for r in theirs) == sorted(cases.PASSES)


def test_subject_and_cpu_peers_run_and_pass_the_check(smoke):
    result, _ = smoke
    for record in result["records"]:
        if record["provider"] in GPU_ONLY or record.get("mode") == "graph":
            continue
        if record["status"] == "skipped":
            assert record["provider"] not in cases.NO_COMPILE_PEERS
            continue
        assert record["status"] == "ok", record
        assert record["correct"] is True
        if record.get("mode") is None:
            assert record["grad_rel_err"] >= 0
            if record["pass"] == "bwd":
                assert record["bwd_method"] == "retained-graph"


def test_same_bytes_copy_is_timed_for_every_training_case_and_pass(smoke):
    """The size-matched reference: per training case and pass, copies moving that pass's bytes
    (one launch each for fwd and bwd, both for fwd+bwd), with a time and a fraction of the
    large copy; none for decode cases."""
    result, proc = smoke
    entries = {(e["case"], e["pass"]): e for e in result["same_bytes_copy"]}
    training = [c for c in cases.smoke_cases() if not c.is_decode]
    assert len(entries) == len(result["same_bytes_copy"]) == len(training) * len(cases.PASSES)
    for case in training:
        for pass_ in cases.PASSES:
            entry = entries[(case.name, pass_)]
            halves = [case.bytes_moved(p) // 2 for p in (("fwd", "bwd") if pass_ == "fwd+bwd"
                                                          else (pass_,))]
            assert entry["bytes"] == 2 * sum(halves)
            assert abs(entry["bytes"] - case.bytes_moved(pass_)) <= 2
            assert entry["launches"] == len(halves)
            assert entry["median_ms"] > 0 and entry["gbps"] > 0
            assert entry["frac_copy"] == pytest.approx(entry["gbps"] / result["copy_gbps"])
    # A fraction of a CPU copy means nothing: the column is a GPU figure
    # (test_gpu_report_prints_bandwidth_and_the_same_bytes_copy covers its printing).
    assert "same-bytes copy" not in proc.stdout


def test_decode_and_first_call_records(smoke):
    result, _ = smoke
    decode = [r for r in result["records"] if r["provider"] == providers.SUBJECT
              and r.get("mode") == "eager"]
    assert decode and all(r["us_per_call"] > 0 for r in decode)
    graph = [r for r in result["records"] if r.get("mode") == "graph"]
    assert all(r["status"] in ("n/a", "missing") for r in graph)  # no CUDA graphs on CPU
    configs = [entry["config"] for entry in result["first_calls"]]
    assert len(configs) == len(set(configs)) > 0


def test_gpu_only_peers_are_reported_not_dropped(smoke):
    result, _ = smoke
    fla = [r for r in result["records"] if r["provider"] in GPU_ONLY]
    assert fla and all(r["status"] in STATUSES for r in fla)
    if providers.fla_version() is None:
        assert {r["status"] for r in fla} <= {"missing", "n/a", "skipped"}
        assert any(r["status"] == "missing" for r in fla)


def test_progress_and_table(smoke):
    _, proc = smoke
    progress = [line for line in proc.stderr.splitlines() if line.startswith("[")]
    assert len(progress) == len(cases.smoke_cases())
    assert "records by status" in proc.stdout
    assert "Decode forward" in proc.stdout


def test_summary_lists_every_measurement_where_a_peer_was_faster():
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    import summarize

    def record(case, pass_, provider, ms=None, mode=None, us=None):
        return {"case": case, "pass": pass_, "provider": provider, "mode": mode,
                "status": "ok", "median_ms": ms, "us_per_call": us}

    result = dict(records=[
        record("a", "fwd", "gatednorm", 1.0), record("a", "fwd", "hf-compile", 0.8),
        record("a", "bwd", "gatednorm", 1.0), record("a", "bwd", "hf-compile", 1.2),
        record("d", "fwd", "gatednorm", mode="graph", us=2.0),
        record("d", "fwd", "fla", mode="graph", us=1.0),
        dict(record("a", "fwd", "fla", 0.5), status="error"),  # a failed peer never counts
    ])
    lines = summarize.peers_faster(result)
    assert lines == ["- a fwd: gatednorm 1000.0 us; faster: hf-compile 1.25x",
                     "- d fwd (graph): gatednorm 2.0 us; faster: fla 2.00x"]


def test_gpu_report_prints_bandwidth_and_the_same_bytes_copy():
    from gatednorm.bench import report

    record = {"case": "c", "pass": "fwd", "provider": "gatednorm", "status": "ok",
              "median_ms": 0.05, "gbps": 4000.0, "frac_copy": 0.95}
    result = {"gpu": "NVIDIA H200", "torch": "2.11", "triton": "3.6", "gatednorm": "0.1.0",
              "date": "d", "copy_gbps": 4210.0, "runtime_s": 1.0, "device": {"type": "cuda"},
              "providers": [{"name": "gatednorm", "status": "available"}],
              "records": [record], "first_calls": [], "fresh_cache": False,
              "same_bytes_copy": [{"case": "c", "pass": "fwd", "frac_copy": 0.9}]}
    text = report.format_report(result)
    assert "copy bandwidth (read + write) 4210 GB/s" in text
    assert "0.050 4000 95%" in text
    assert "same-bytes copy" in text and "90%" in text
