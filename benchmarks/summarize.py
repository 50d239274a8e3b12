"""Markdown tables from a results file of ``python -m gatednorm.bench``.

    python benchmarks/summarize.py benchmarks/results/h200-2026-12-02-bench-v2.json

Prints the training table (gatednorm's time and fraction of the copy bandwidth per pass, and
each peer's fwd+bwd time over gatednorm's) and the decode table, as used in the README and
docs/perf-notes.md, so that every figure there can be regenerated from the committed file.
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
    lines = ["| case | fwd | bwd | fwd+bwd | " + " | ".join(f"{p} fwd+bwd" for p in PEERS) + " |",
             "| --- " * (4 + len(PEERS)) + "|"]
    for case in cases:
        ours = {p: table.get((case, p, None, "gatednorm")) for p in ("fwd", "bwd", "fwd+bwd")}
        if not all(_ok(r) for r in ours.values()):
            continue
        cells = [f"{r['median_ms']:.3f} ms, {r['frac_copy'] * 100:.0f} %" for r in ours.values()]
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


def main() -> None:
    result = json.load(open(sys.argv[1]))
    print(f"{result['gpu']}, torch {result['torch']}, triton {result['triton']}, "
          f"{result['date']}, copy {result['copy_gbps']:.0f} GB/s; `{result['command']}`\n")
    print("\n".join(training_table(result)))
    print()
    print("\n".join(decode_table(result)))


if __name__ == "__main__":
    main()
