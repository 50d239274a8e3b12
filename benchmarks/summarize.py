"""Markdown tables from a results file of ``python -m gatednorm.bench``.

    python benchmarks/summarize.py benchmarks/results/h200.json

Prints the training table (gatednorm's time and fraction of the copy bandwidth per pass, and
each peer's fwd+bwd time over gatednorm's), the decode table, and every measurement where a
peer was faster than gatednorm, as used in the README and docs/perf-notes.md, so that every
figure there can be regenerated from the committed file.
"""

from __future__ import annotations

import json
import sys

from gatednorm.bench.report import index_records

PEERS = ("hf-compile", "fla", "fla-mamba", "hf-eager", "megatron-eager")


def _ok(record):
    return record is not None and record.get("status") == "ok" and record.get("median_ms")


def training_table(result) -> list[str]:
    table = index_records(result["records"])
    cases = [c["case"] for c in result["cases"] if c["family"] != "decode"]
    # Files since bench-v11 also time copies moving each pass's bytes (what the size allows).
    copies = {(c["case"], c["pass"]): c for c in result.get("same_bytes_copy", [])}
    copy_column = ["same-bytes copy fwd / bwd"] if copies else []
    lines = ["| case | fwd | bwd | fwd+bwd | " + " | ".join(
                copy_column + [f"{p} fwd+bwd" for p in PEERS]) + " |",
             "| --- " * (4 + len(copy_column) + len(PEERS)) + "|"]
    for case in cases:
        ours = {p: table.get((case, p, None, "gatednorm")) for p in ("fwd", "bwd", "fwd+bwd")}
        if not all(_ok(r) for r in ours.values()):
            continue
        cells = [f"{r['median_ms']:.3f} ms, {r['frac_copy'] * 100:.0f} %" for r in ours.values()]
        if copies:
            fracs = [copies.get((case, p)) for p in ("fwd", "bwd")]
            cells.append(" / ".join(f"{c['frac_copy'] * 100:.0f} %" if c else "-"
                                    for c in fracs))
        for peer in PEERS:
            other = table.get((case, "fwd+bwd", None, peer))
            cells.append(f"{other['median_ms'] / ours['fwd+bwd']['median_ms']:.2f}x"
                         if _ok(other) else "n/a")
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    return lines


def decode_table(result) -> list[str]:
    table = index_records(result["records"])
    cases = [c["case"] for c in result["cases"] if c["family"] == "decode"]
    providers = ("gatednorm",) + PEERS
    lines = ["| case | " + " | ".join(f"{p} eager / graph (us)" for p in providers) + " |",
             "| --- " * (1 + len(providers)) + "|"]
    for case in cases:
        cells = []
        for provider in providers:
            eager = table.get((case, "fwd", "eager", provider))
            graph = table.get((case, "fwd", "graph", provider))
            if not (_ok(eager) and _ok(graph)):
                cells.append("n/a")
                continue
            cells.append(f"{eager['us_per_call']:.1f} / {graph['us_per_call']:.1f}")
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    return lines


def _time(record):
    """The time a record measured: median_ms, or us_per_call for decode (in ms)."""
    if record is None or record.get("status") != "ok":
        return None
    if record.get("us_per_call") is not None:
        return record["us_per_call"] / 1000.0
    return record.get("median_ms")


def peers_faster(result) -> list[str]:
    """One line per (case, pass, mode) where some peer took less time than gatednorm."""
    table = index_records(result["records"])
    lines = []
    for (case, pass_, mode, provider), record in table.items():
        if provider != "gatednorm" or _time(record) is None:
            continue
        ours = _time(record)
        faster = [f"{peer} {ours / _time(other):.2f}x" for peer in PEERS
                  if _time(other := table.get((case, pass_, mode, peer))) is not None
                  and _time(other) < ours]
        if faster:
            what = f"{case} {pass_}" + (f" ({mode})" if mode else "")
            lines.append(f"- {what}: gatednorm {ours * 1000:.1f} us; faster: "
                         + ", ".join(faster))
    return lines


def main() -> None:
    result = json.load(open(sys.argv[1]))
    print(f"{result['gpu']}; cases from these runs:\n")
    for run in result["runs"]:
        cases = sum(1 for c in result["cases"] if c["run"] == run["run"])
        print(f"- {run['date']}, tree {run['tree']}, torch {run['torch']}, triton "
              f"{run['triton']}, copy {run['copy_gbps']:.0f} GB/s, {cases} cases: "
              f"`{run['command']}`")
    print()
    print("\n".join(training_table(result)))
    print()
    print("\n".join(decode_table(result)))
    print("\nPeers faster than gatednorm (their speed over gatednorm's):")
    print("\n".join(peers_faster(result)) or "- none")


if __name__ == "__main__":
    main()
