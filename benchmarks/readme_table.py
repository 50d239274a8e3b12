"""The README's performance table, generated from a results file of ``python -m gatednorm.bench``.

    python benchmarks/readme_table.py                           # print it (benchmarks/results/h200.json)
    python benchmarks/readme_table.py --write README.md         # replace the README's block
    python benchmarks/readme_table.py --check README.md         # exit 1 if the README's block differs

The block sits between the markers ``<!-- perf-table:start -->`` and ``<!-- perf-table:end -->``;
the FP8-output table (the ``quantized`` section of ``--fp8-results``, by default FP8_RESULTS)
between ``<!-- fp8-table:start -->`` and ``<!-- fp8-table:end -->``.
Rows: the bf16 model shapes with a contiguous gate (and GDN with a gate sliced from a
projection), then the bf16 D sweep in two ranges; one decode line. Every figure is read from
the file: gatednorm's fraction of the copy bandwidth per pass (``frac_copy``), its fwd+bwd
time, and each peer's fwd+bwd time over gatednorm's (``tests/test_readme_table.py`` checks
that the committed README matches the committed file).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gatednorm.bench.report import index_records

DEFAULT_RESULTS = Path("benchmarks") / "results" / "h200.json"
# The FP8-output table's file: its "quantized" section.
FP8_RESULTS = Path("benchmarks") / "results" / "h200.json"
START, END = "<!-- perf-table:start -->", "<!-- perf-table:end -->"
# (label, cases): one case gives exact figures, several give ranges.
ROWS = (
    ("GDN 4096 x 32 x 128", ["head128-4096x32-silu-bf16-contig"]),
    ("GDN 8192 x 32 x 128", ["head128-8192x32-silu-bf16-contig"]),
    ("GDN 8192 x 32 x 128, gate sliced from a projection", ["head128-8192x32-silu-bf16-proj"]),
    ("GDN 65536 x 32 x 128", ["head128-65536x32-silu-bf16-contig"]),
    ("Kimi 4096 x 96 x 128, sigmoid", ["head128-4096x96-sigmoid-bf16-contig"]),
    ("Nemotron-H 8192 x 8192, groups of 1024, gate first",
     ["nemotronh-8192x8192-g1024-bf16-contig"]),
    ("Mamba2 8192 x 5120, groups of 640, gate first", ["mamba2-8192x5120-g640-bf16-contig"]),
    ("D = 64 to 8192 (8 widths, 50M elements each)",
     [f"sweep-d{d}-{48 * 2**20 // d}r-bf16" for d in (64, 96, 192, 256, 1024, 2048, 4096, 8192)]),
    ("D = 16384 and 32768", ["sweep-d16384-3072r-bf16", "sweep-d32768-1536r-bf16"]),
)
# Column -> providers tried in order (FLA's Mamba-style op where its fused norm cannot run).
PEERS = (("torch.compile", ("hf-compile",)), ("FLA", ("fla", "fla-mamba")),
         ("eager transformers", ("hf-eager",)))
DECODE_CASE = "decode-1x32x128-bf16"


def _ok(record: dict | None) -> bool:
    return record is not None and record["status"] == "ok"


def _span(values: list[float], fmt, unit: str) -> str:
    """'lo-hi<unit>', or one value when both print alike; ``fmt`` formats one value."""
    low, high = fmt(min(values)), fmt(max(values))
    return (low if low == high else f"{low}-{high}") + unit


def _whole(value: float) -> str:
    return f"{value:.0f}"


def _ratio(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def _peer_cell(index: dict, cases: list[str], names: tuple[str, ...]) -> str:
    ratios, labels = [], set()
    for case in cases:
        mine = index[(case, "fwd+bwd", None, "gatednorm")]
        for name in names:
            peer = index.get((case, "fwd+bwd", None, name))
            if _ok(peer):
                ratios.append(peer["median_ms"] / mine["median_ms"])
                labels.add(name)
                break
    if not ratios:
        return "-"
    suffix = " (Mamba op)" if labels == {"fla-mamba"} else ""
    return _span(ratios, _ratio, "x") + suffix


def table_rows(result: dict) -> list[str]:
    index = index_records(result["records"])
    lines = ["| case | fwd | bwd | fwd+bwd | " + " | ".join(f"vs {c}" for c, _ in PEERS) + " |",
             "| --- " * (4 + len(PEERS)) + "|"]
    for label, cases in ROWS:
        subject = {p: [index[(c, p, None, "gatednorm")] for c in cases]
                   for p in ("fwd", "bwd", "fwd+bwd")}
        if not all(_ok(r) for records in subject.values() for r in records):
            raise ValueError(f"{label}: gatednorm has no ok record in {cases}")
        percent = {p: _span([100 * r["frac_copy"] for r in records], _whole, " %")
                   for p, records in subject.items()}
        both = percent["fwd+bwd"]
        if len(cases) == 1:
            both = f"{subject['fwd+bwd'][0]['median_ms']:.3f} ms, {both}"
        cells = [label, percent["fwd"], percent["bwd"], both]
        cells += [_peer_cell(index, cases, names) for _, names in PEERS]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def decode_line(result: dict) -> str:
    index = index_records(result["records"])

    def us(provider: str, mode: str) -> str:
        record = index.get((DECODE_CASE, "fwd", mode, provider))
        return f"{record['us_per_call']:.1f} us" if _ok(record) else "-"

    return (f"Decode, one token x 32 heads x 128 (bf16, gate sliced from a projection): "
            f"{us('gatednorm', 'graph')} per forward inside a CUDA graph (torch.compile "
            f"{us('hf-compile', 'graph')}, FLA {us('fla', 'graph')}), {us('gatednorm', 'eager')} "
            f"per eager call, host included (torch.compile {us('hf-compile', 'eager')}, FLA "
            f"{us('fla', 'eager')}).")


def method_line(result: dict, results_path: str) -> str:
    copies = [run["copy_gbps"] for run in result["runs"]]
    gbps = _span(copies, _whole, " GB/s")
    return (f"{result['gpu']}, bf16, `{results_path}`: median kernel time on L2-cold inputs, "
            f"as a percentage of the copy bandwidth measured in the same run ({gbps}, read + "
            f"write); peers as their forward+backward time over gatednorm's (above 1x: "
            f"gatednorm is faster).")


def block(result: dict, results_path: str) -> str:
    lines = [START, method_line(result, results_path), "", *table_rows(result), "",
             decode_line(result), END]
    return "\n".join(lines)


# The FP8-output table: the results file's "quantized" section (python -m gatednorm.bench
# --quantized), one row per model shape, one column per format.
FP8_START, FP8_END = "<!-- fp8-table:start -->", "<!-- fp8-table:end -->"
FP8_FORMATS = (("1x128", "1x128"), ("1x128_ue8m0", "1x128 UE8M0"), ("mxfp8", "MXFP8"),
               ("delayed", "per-tensor delayed"), ("per_tensor", "per-tensor current"),
               ("1x128_columnwise", "1x128 + columnwise"),
               ("mxfp8_columnwise", "MXFP8 + columnwise"))


def fp8_block(result: dict, results_path: str) -> str:
    quantized = result.get("quantized")
    if quantized is None:
        return "\n".join([FP8_START, f"Not measured yet (`{results_path}` has no `quantized` "
                                      f"section).", FP8_END])
    index = {(r["case"], r["format"]): r for r in quantized["records"]}
    cases = list(dict.fromkeys(r["case"] for r in quantized["records"]))
    header = "| case | " + " | ".join(label for _, label in FP8_FORMATS) + " |"
    lines = [FP8_START,
             f"{quantized['gpu']}, bf16 inputs, `{results_path}` (`quantized`): the fused "
             f"forward's time, its bytes as a percentage of the copy bandwidth "
             f"({_whole(quantized['copy_gbps'])} GB/s), and its speedup over the same work "
             f"unfused (gatednorm's bf16 forward, then the fastest quantizer measured for the "
             f"format).", "", header, "|" + " --- |" * (len(FP8_FORMATS) + 1)]
    for case in cases:
        cells = []
        for name, _ in FP8_FORMATS:
            r = index.get((case, name))
            cells.append("-" if r is None or r["status"] != "ok" else
                         f"{r['fused_ms'] * 1e3:.0f} us, {100 * r['fused_frac_copy']:.0f} %, "
                         f"{r['speedup_vs_fastest_unfused']:.2f}x")
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    same = [r for r in quantized["records"]
            if r["status"] == "ok" and "fused_frac_same_bytes_copy" in r]
    if same:
        def percent_span(records):
            return _span([100 * r["fused_frac_same_bytes_copy"] for r in records],
                         lambda v: f"{v:.0f}", " %")
        rowwise = [r for r in same if not r["format"].endswith("columnwise")]
        columnwise = [r for r in same if r["format"].endswith("columnwise")]
        parts = [f"{label} {percent_span(records)}" for label, records in
                 (("rowwise formats", rowwise), ("with a columnwise copy", columnwise))
                 if records]
        lines += ["", "Against copies that move the same bytes in as many launches (what each "
                      "size alone allows, launch ramp-up and last wave included): "
                  + ", ".join(parts) + "."]
    if quantized.get("note"):
        lines += ["", quantized["note"]]
    elif quantized.get("git_commit"):
        lines += ["", f"Measured on tree {quantized['git_commit'][:7]}."]
    decode = quantized.get("decode", [])
    if decode:
        diffs = [d["difference_us"] for d in decode]
        tokens = [d["tokens"] for d in decode]
        lines += ["", f"Decode ({min(tokens)} to {max(tokens)} tokens x 32 x 128, in a CUDA "
                      f"graph): the 1x128 output costs {_span(diffs, lambda v: f'{v:.2f}', ' us')} "
                      f"more than the bf16 forward."]
    lines.append(FP8_END)
    return "\n".join(lines)


def replace_block(text: str, new_block: str, start_marker: str = START,
                  end_marker: str = END) -> str:
    start, end = text.find(start_marker), text.find(end_marker)
    if start < 0 or end < start:
        raise ValueError(f"no {start_marker} ... {end_marker} block found")
    return text[:start] + new_block + text[end + len(end_marker):]


def readme_with_tables(text: str, result: dict, results_path: str,
                       fp8_result: dict | None = None, fp8_path: str | None = None) -> str:
    """``text`` with both generated blocks replaced; the FP8 block from ``fp8_result`` (read
    from ``fp8_path``) when given, else from ``result``."""
    text = replace_block(text, block(result, results_path))
    if fp8_result is None:
        fp8_result, fp8_path = result, results_path
    return replace_block(text, fp8_block(fp8_result, fp8_path), FP8_START, FP8_END)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", nargs="?", type=Path, default=DEFAULT_RESULTS)
    parser.add_argument("--fp8-results", type=Path, default=FP8_RESULTS,
                        help="the file whose 'quantized' section fills the FP8 table")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", type=Path, metavar="README", help="replace the block in it")
    action.add_argument("--check", type=Path, metavar="README",
                        help="exit 1 if its block differs from the generated one")
    args = parser.parse_args(argv)
    result = json.loads(args.results.read_text())
    path = args.results.as_posix()
    fp8 = (json.loads(args.fp8_results.read_text()), args.fp8_results.as_posix())
    if args.write:
        args.write.write_text(readme_with_tables(args.write.read_text(), result, path, *fp8))
    elif args.check:
        if readme_with_tables(args.check.read_text(), result, path, *fp8) \
                != args.check.read_text():
            print(f"{args.check}: the performance tables differ from {args.results}; run "
                  f"python benchmarks/readme_table.py --write {args.check}", file=sys.stderr)
            return 1
    else:
        print(block(result, path) + "\n\n" + fp8_block(*fp8))
    return 0


if __name__ == "__main__":
    sys.exit(main())
