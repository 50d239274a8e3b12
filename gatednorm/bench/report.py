"""Results: the JSON file, the table printed at the end of a run, and the bandwidth plot.

Every record is one (provider, case, pass) — plus ``mode`` for decode — with ``status``:
``"ok"``; ``"wrong"`` (timed, but its output failed the correctness check: never counted as a
win); ``"error"`` (it raised; the message is in ``error``); ``"n/a"`` (the provider cannot
express the case); ``"missing"`` (not installed); ``"skipped"`` (not reached within
``--budget-s``). Times are None unless the status is ok or wrong.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

from gatednorm.bench.providers import SUBJECT

TIMED_STATUSES = ("ok", "wrong")


def timed(record: dict) -> bool:
    return record["status"] in TIMED_STATUSES and record.get("median_ms") is not None


def _finite(value):
    """NaN and infinities as None: strict JSON has no token for them (``correct`` still says
    whether a check failed)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def write_json(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_finite(result), indent=1, allow_nan=False) + "\n")


def index_records(records: Iterable[dict]) -> dict:
    """Records by (case, pass, mode, provider); mode is None outside decode."""
    return {(r["case"], r["pass"], r.get("mode"), r["provider"]): r for r in records}


def _row_keys(records: list[dict], decode: bool) -> list[tuple]:
    """(case, pass, mode) in first-seen order."""
    keys: dict[tuple, None] = {}
    for r in records:
        if (r.get("mode") is not None) == decode:
            keys.setdefault((r["case"], r["pass"], r.get("mode")), None)
    return list(keys)


def _status_cell(record: dict | None) -> str:
    if record is None:
        return "-"
    return record["status"] if record["status"] != "error" else "ERROR"


def _subject_cell(record: dict | None, decode: bool, bandwidth: bool) -> str:
    if record is None or not timed(record):
        return _status_cell(record)
    flag = "" if record["status"] == "ok" else " WRONG"
    if decode:
        return f"{record['us_per_call']:.1f}us{flag}"
    if not bandwidth:
        return f"{record['median_ms']:.3f}{flag}"
    return f"{record['median_ms']:.3f} {record['gbps']:.0f} {record['frac_copy']:.0%}{flag}"


def _peer_cell(peer: dict | None, subject: dict | None, decode: bool) -> str:
    if peer is None or not timed(peer):
        return _status_cell(peer)
    value = f"{peer['us_per_call']:.1f}us" if decode else f"{peer['median_ms']:.3f}"
    if peer["status"] == "wrong":
        return value + " WRONG"
    if subject is None or subject["status"] != "ok" or not timed(subject):
        return value
    return f"{value} {peer['median_ms'] / subject['median_ms']:.2f}x"


def _table(records: list[dict], providers: list[str], decode: bool, bandwidth: bool,
           same_bytes_copy: list[dict] | None = None) -> list[str]:
    index = index_records(records)
    keys = _row_keys(records, decode)
    if not keys:
        return []
    peers = [p for p in providers if p != SUBJECT]
    copies = ({(c["case"], c["pass"]): c for c in same_bytes_copy or []}
              if bandwidth and not decode else {})
    width = max(len(k[0]) for k in keys)
    label = "mode" if decode else "pass"
    subject_width = 14 if decode else 22
    header = (f"{'case':<{width}}  {label:<7}  {SUBJECT:<{subject_width}}"
              + (f"  {'same-bytes copy':<15}" if copies else "")
              + "".join(f"  {p:<17}" for p in peers))
    lines = [header, "-" * len(header)]
    for case, pass_, mode in keys:
        subject = index.get((case, pass_, mode, SUBJECT))
        row = (f"{case:<{width}}  {(mode or pass_):<7}  "
               f"{_subject_cell(subject, decode, bandwidth):<{subject_width}}")
        if copies:
            copy = copies.get((case, pass_))
            cell = f"{copy['frac_copy']:.0%}" if copy else "-"
            row += f"  {cell:<15}"
        for peer in peers:
            row += f"  {_peer_cell(index.get((case, pass_, mode, peer)), subject, decode):<17}"
        lines.append(row)
    return lines


def format_report(result: dict) -> str:
    """The tables printed at the end of a run."""
    records = result["records"]
    providers = [p["name"] for p in result["providers"]]
    # Bandwidth is a GPU figure: a CPU run times tiny shapes to show the code paths run.
    bandwidth = result.get("device", {}).get("type") == "cuda"
    lines = [
        f"gatednorm bench: {result['gpu']}, torch {result['torch']}, triton {result['triton']}, "
        f"gatednorm {result.get('gatednorm')}, {result['date']}",
        f"gatednorm ran {result.get('subject_path', 'Triton kernels')}; runtime "
        f"{result['runtime_s']:.0f} s; "
        + (f"copy bandwidth (read + write) {result['copy_gbps']:.0f} GB/s" if bandwidth else
           "CPU: wall-clock times of tiny shapes, no bandwidth figures"),
        "",
    ]
    if bandwidth:
        lines.append("Training-size passes. gatednorm: median ms, GB/s, fraction of copy "
                     "bandwidth. Same-bytes copy: copies moving the pass's bytes, timed alike, "
                     "as a fraction of the large copy (what the size alone allows). Peers: "
                     "median ms and their time over gatednorm's (>1x: gatednorm is faster).")
    else:
        lines.append("Training-size passes: median ms per call of gatednorm and each peer, "
                     "with the peer's time over gatednorm's.")
    lines += _table(records, providers, decode=False, bandwidth=bandwidth,
                    same_bytes_copy=result.get("same_bytes_copy"))
    decode = _table(records, providers, decode=True, bandwidth=bandwidth)
    if decode:
        lines += ["", "Decode forward, time per call with host overhead (eager) and per CUDA "
                      "graph replay (graph); peers with their time over gatednorm's."]
        lines += decode
    if result.get("first_calls"):
        lines += ["", "gatednorm first call per config (wall s, compile included"
                      f"{', fresh Triton cache' if result['fresh_cache'] else ''}):"]
        for entry in result["first_calls"]:
            bwd = entry.get("bwd_first_call_s")
            lines.append(f"  {entry['config']:<48} fwd {entry['fwd_first_call_s']:7.3f}"
                         + (f"  bwd {bwd:7.3f}" if bwd is not None else ""))
    counts: dict[str, int] = {}
    for r in records:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    lines += ["", "records by status: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))]
    # Errors and failed checks one by one (once per provider and case); skips by reason.
    seen = set()
    skipped: dict[str, int] = {}
    for r in records:
        if r["status"] == "skipped":
            skipped[r["error"]] = skipped.get(r["error"], 0) + 1
        elif r["status"] in ("error", "wrong"):
            key = (r["provider"], r["case"], r["status"], r.get("error"))
            if key not in seen:
                seen.add(key)
                lines.append(f"  {r['status']}: {r['provider']} / {r['case']}: "
                             f"{r.get('error') or _check_summary(r)}")
    lines += [f"  skipped ({n} records): {reason}" for reason, n in skipped.items()]
    lines += [f"  {p['name']}: {p['reason']}" for p in result["providers"]
              if p.get("status") == "missing"]
    return "\n".join(lines)


def _check_summary(record: dict) -> str:
    return (f"max_abs_err {record.get('max_abs_err')}, tol_ratio {record.get('tol_ratio')}, "
            f"grad_rel_err {record.get('grad_rel_err')}")


def plot(result: dict, path: Path) -> str | None:
    """Fraction of copy bandwidth per case, one line per provider, fwd and fwd+bwd panels.
    Returns None when written, else why not (matplotlib missing, nothing timed)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        return f"no plot ({error}; pip install matplotlib)"
    records = [r for r in result["records"] if r.get("mode") is None]
    cases = list(dict.fromkeys(r["case"] for r in records))
    if not cases:
        return "no plot: no training-size records"
    index = index_records(records)
    providers = [p["name"] for p in result["providers"]]
    figure, axes = plt.subplots(2, 1, figsize=(max(10, 0.32 * len(cases) + 3), 10), sharex=True)
    for ax, pass_ in zip(axes, ("fwd", "fwd+bwd")):
        for provider in providers:
            values = []
            for case in cases:
                r = index.get((case, pass_, None, provider))
                values.append(r["frac_copy"] if r is not None and timed(r) else math.nan)
            if not all(math.isnan(v) for v in values):
                ax.plot(range(len(cases)), values, marker="o", markersize=3, linewidth=1,
                        label=provider)
        ax.set_title(f"{pass_}: fraction of copy bandwidth ({result['copy_gbps']:.0f} GB/s)")
        ax.set_ylabel("bytes moved / time / copy bandwidth")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[-1].set_xticks(range(len(cases)))
    axes[-1].set_xticklabels(cases, rotation=90, fontsize=7)
    figure.suptitle(f"gatednorm bench, {result['gpu']}, {result['date']}")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return None
