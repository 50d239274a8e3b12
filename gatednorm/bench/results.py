"""The per-GPU results file: one current measurement of every case, and where each came from.

``benchmarks/results/<gpu>.json`` (e.g. ``h200.json``) holds, for every case, the records of
the latest run that measured it. A run (``python -m gatednorm.bench`` on a GPU, full or
``--cases``) replaces the cases it measured and keeps the others, so the file stays one table
of the current code. Fields:

- the header of the latest run (``gpu``, ``torch``, ``triton``, ``gatednorm``, ``date``,
  ``command``, ``copy_gbps``, ...), as a single run writes it;
- ``runs``: every run that still provides a case, by ``run`` id (its start time): date,
  command, versions, ``tree`` (git commit), its copy bandwidth, and ``source``/``note`` where
  the run was recorded elsewhere first;
- ``cases``: each case's description plus ``run``, the run its records come from;
- ``records``, ``same_bytes_copy``, ``first_calls``: as a single run writes them (see
  :mod:`gatednorm.bench.report`); each record's ``frac_copy`` is relative to its own run's copy
  bandwidth;
- ``quantized``: the latest full GPU run of :mod:`gatednorm.bench.quantized` (its own header,
  records and decode timings), replaced whole by the next one.
"""

from __future__ import annotations

import datetime
import json
import platform
import subprocess
import tempfile
from pathlib import Path

import torch

from gatednorm.bench import timing

FORMAT = "gatednorm.bench results, version 1"
RESULTS_DIR = Path("benchmarks") / "results"
# Header fields copied into each run's entry of ``runs``.
RUN_FIELDS = ("date", "command", "gpu", "torch", "triton", "gatednorm", "python", "fla",
              "copy_gbps", "mode", "options", "all_peers", "budget_s", "triton_interpret")
# The FP8-output benchmark's latest run (python -m gatednorm.bench.quantized), whole.
QUANTIZED = "quantized"
# Lists whose entries belong to one case (by their "case" field).
PER_CASE_LISTS = ("records", "same_bytes_copy", "first_calls")


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'h200'; 'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3'."""
    words = name.lower().replace("nvidia", "").split()
    return "-".join(words) or "gpu"


def default_path(gpu: str) -> Path:
    return RESULTS_DIR / f"{gpu_slug(gpu)}.json"


def git_commit() -> str | None:
    """HEAD of the checkout this package runs from, "-dirty" when tracked files differ."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=here, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, cwd=here, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def device_info(device: torch.device) -> dict:
    if not timing.is_cuda(device):
        return {"type": "cpu", "processor": platform.processor() or platform.machine(),
                "l2_bytes_assumed": timing.l2_bytes(device)}
    props = torch.cuda.get_device_properties(device)
    return {"type": "cuda", "name": props.name, "capability": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count, "memory_bytes": props.total_memory,
            "l2_bytes": timing.l2_bytes(device), "cuda": torch.version.cuda}


def output_path(device: torch.device, mode: str, gpu: str,
                some_providers: bool) -> tuple[Path, bool, str]:
    """(path, update, why) for a run without --out. A full or --cases run on a GPU that times
    every provider updates the GPU's results file; smoke, quick, CPU and --providers runs
    write a file of their own under the temporary directory (why: the reason)."""
    if timing.is_cuda(device) and mode == "full" and not some_providers:
        return default_path(gpu), True, "updated case by case"
    if not timing.is_cuda(device):
        why = "a CPU run"
    elif mode != "full":
        why = f"a --{mode} run"
    else:
        why = "--providers times only some providers"
    date = datetime.date.today().isoformat()
    path = Path(tempfile.gettempdir()) / "gatednorm-bench" / f"{mode}-{device.type}-{date}.json"
    return path, False, f"{why}; {RESULTS_DIR}/<gpu>.json takes full GPU runs only"


def run_entry(header: dict, tree: str | None) -> dict:
    """What ``runs`` keeps of one run's header; ``run`` (its id) is its start time."""
    entry = {"run": header["date"], "tree": tree}
    entry.update({k: header[k] for k in RUN_FIELDS if k in header})
    return entry


def measured_cases(records: list[dict]) -> set[str]:
    """Cases a run measured: any record that is not a placeholder for an unreached case."""
    return {r["case"] for r in records
            if not (r["status"] == "skipped" and "--budget-s" in (r.get("error") or ""))}


def single_run(header: dict, records: list[dict], same_bytes_copy: list[dict],
               first_calls: list[dict]) -> dict:
    """The results of one run in the file format: every case it measured points at it."""
    run = run_entry(header, header.get("git_commit"))
    measured = measured_cases(records)
    cases = [{**c, "run": run["run"] if c["case"] in measured else None}
             for c in header["cases"]]
    return {"format": FORMAT, **header, "runs": [run], "cases": cases,
            "first_calls": first_calls, "same_bytes_copy": same_bytes_copy,
            "records": records}


def merge(old: dict, new: dict) -> dict:
    """``old`` with every case that ``new`` measured replaced by ``new``'s; the header is
    ``new``'s; runs no case points at any more are dropped. Case order: ``new``'s cases in its
    order, then ``old``'s other cases."""
    replaced = {c["case"] for c in new["cases"] if c.get("run") is not None}
    kept_cases = [c for c in old["cases"] if c["case"] not in replaced]
    new_cases = [c for c in new["cases"] if c.get("run") is not None]
    order = [c["case"] for c in new["cases"]] + [c["case"] for c in kept_cases]
    rank = {name: i for i, name in enumerate(dict.fromkeys(order))}
    cases = sorted(new_cases + kept_cases, key=lambda c: rank[c["case"]])
    used = {c["run"] for c in cases}
    runs = [r for r in old.get("runs", []) + new["runs"] if r["run"] in used]
    merged = {**new, "runs": list({r["run"]: r for r in runs}.values()), "cases": cases}
    if QUANTIZED in old and QUANTIZED not in new:
        merged[QUANTIZED] = old[QUANTIZED]
    for key in PER_CASE_LISTS:
        entries = [e for e in old.get(key, []) if e["case"] not in replaced]
        entries += [e for e in new.get(key, []) if e["case"] in replaced]
        merged[key] = sorted(entries, key=lambda e: rank.get(e["case"], len(rank)))
    return merged


def load(path: Path) -> dict | None:
    if not path.exists():
        return None
    result = json.loads(path.read_text())
    if result.get("format") != FORMAT:
        raise ValueError(f"{path} is not a results file of this format ({FORMAT!r}); "
                         f"pass --out to write elsewhere")
    return result
