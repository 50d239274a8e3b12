"""The README's performance table is what benchmarks/readme_table.py generates from the committed
results file, and the generator reads the figures it claims to read."""

import copy
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import readme_table  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "h200.json"


@pytest.fixture(scope="module")
def result():
    return json.loads(RESULTS.read_text())


def test_readme_table_matches_the_committed_results(result):
    readme = (ROOT / "README.md").read_text()
    fp8 = json.loads((ROOT / readme_table.FP8_RESULTS).read_text())
    generated = readme_table.readme_with_tables(readme, result, "benchmarks/results/h200.json",
                                                fp8, readme_table.FP8_RESULTS.as_posix())
    assert generated == readme, (
        "README.md's performance tables are stale: python benchmarks/readme_table.py --write "
        "README.md")


def test_every_row_reads_its_cases_fwd_bwd_figures(result):
    """Change one case's gatednorm fwd+bwd time: its row's time and every peer ratio move."""
    changed = copy.deepcopy(result)
    case = "head128-8192x32-silu-bf16-contig"
    for record in changed["records"]:
        if record["case"] == case and record["provider"] == "gatednorm" \
                and record["pass"] == "fwd+bwd":
            record["median_ms"] *= 2
            record["frac_copy"] /= 2
    before = {row.split(" | ")[0]: row for row in readme_table.table_rows(result)}
    after = {row.split(" | ")[0]: row for row in readme_table.table_rows(changed)}
    label = "| GDN 8192 x 32 x 128"
    cells_before, cells_after = before[label].split(" | "), after[label].split(" | ")
    assert cells_before[1:3] == cells_after[1:3]  # fwd and bwd untouched
    assert cells_before[3] != cells_after[3]
    for old, new in zip(cells_before[4:], cells_after[4:]):
        ratio_old = float(old.strip(" |").split("x")[0])
        ratio_new = float(new.strip(" |").split("x")[0])
        assert ratio_new == pytest.approx(ratio_old / 2, rel=0.02)
    others = [k for k in before if k != label]
    assert all(before[k] == after[k] for k in others)


def test_a_missing_subject_record_is_an_error(result):
    broken = copy.deepcopy(result)
    broken["records"] = [r for r in broken["records"]
                         if not (r["case"] == "sweep-d96-524288r-bf16"
                                 and r["provider"] == "gatednorm")]
    with pytest.raises(KeyError):
        readme_table.table_rows(broken)


def test_the_results_file_names_a_run_for_every_case(result):
    runs = {run["run"]: run for run in result["runs"]}
    assert result["format"] == "gatednorm.bench results, version 1"
    for case in result["cases"]:
        run = runs[case["run"]]
        assert run["date"] and run["command"] and run["tree"] and run["torch"]
    assert {r["case"] for r in result["records"]} == {c["case"] for c in result["cases"]}
    assert os.path.basename(RESULTS) == "h200.json"
