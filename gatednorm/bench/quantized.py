"""Benchmark of the FP8 output: fused quantized forward against the same work unfused.

``python -m gatednorm.bench.quantized [--out PATH] [--smoke] [--cases ...]``
(also ``python -m gatednorm.bench --quantized ...``)

For the GDN, Kimi, Mamba2 and Nemotron-H shapes (bf16), each format is timed three ways,
side by side in one run: gatednorm's fused quantized forward; gatednorm's bf16 forward then
torch.compile of the reference quantizer (dynamic shapes, compiled once per format; both
copies for the columnwise formats); and the bf16 forward then TransformerEngine's quantizer
where transformer_engine is importable.
Times are medians of single calls with L2-cold inputs (gatednorm.bench.timing.measure over
rotated input sets); bandwidth is bytes moved over time, as a fraction of a large
device-to-device copy, and of copies moving the same bytes in as many launches (what the
size alone allows). Decode sizes (1-32 tokens x 32 heads x 128) are timed inside a CUDA
graph against the bf16 forward. ``--smoke`` runs tiny shapes on the CPU (through the
interpreter when TRITON_INTERPRET=1) to prove the code paths, with no timing claims.

Without ``--out`` a full GPU run stores its results as the ``quantized`` section of the GPU's
results file (``benchmarks/results/<gpu>.json``, beside ``python -m gatednorm.bench``'s cases);
other runs write a file under the temporary directory.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import triton

import gatednorm
from gatednorm.bench import results as results_file
from gatednorm.bench.timing import (
    FULL,
    GRAPH_CALLS,
    SMOKE,
    capture_graph,
    copy_bandwidth_gbps,
    measure,
    per_call_us,
    same_bytes_copy_ms,
)
from gatednorm.quantize import (
    as_format,
    columnwise_quantize,
    per_tensor,
    quantized_rms_norm_gated,
    reference_quantize,
)
from gatednorm.quantize.reference import mismatches

COPY_BYTES = 2**30
# Input sets rotated so that one round touches this many times the H200's 60 MB L2.
ROTATION_BYTES = 4 * 60 * 2**20
MAX_SETS = 8
DECODE_TOKENS = (1, 4, 8, 16, 32)
FORMATS = ("1x128", "1x128_ue8m0", "mxfp8", "delayed", "per_tensor", "1x128_columnwise",
           "mxfp8_columnwise")


@dataclass(frozen=True)
class Shape:
    name: str
    tokens: int
    k: int
    group_size: int
    activation: str = "silu"
    norm_before_gate: bool = True


SHAPES = (
    Shape("gdn-8192x32x128", 8192, 4096, 128),
    Shape("gdn-4096x32x128", 4096, 4096, 128),
    Shape("gdn-65536x32x128", 65536, 4096, 128),
    Shape("kimi-4096x96x128", 4096, 12288, 128, "sigmoid"),
    Shape("mamba2-8192x5120", 8192, 5120, 640, norm_before_gate=False),
    Shape("nemotronh-8192x8192", 8192, 8192, 1024, norm_before_gate=False),
)
SMOKE_SHAPES = (Shape("gdn-smoke", 8, 256, 128), Shape("mamba2-smoke", 4, 1280, 640,
                                                       norm_before_gate=False))


def fmt_of(name: str, device: torch.device):
    if name == "delayed":
        # As a delayed-scaling recipe runs it: the given scale, and the recipe's amax buffer,
        # which the kernel maxes into (the first call's amax is checked: the buffer starts at 0).
        return per_tensor(torch.tensor([0.01], device=device),
                          amax_out=torch.zeros(1, device=device))
    return as_format(name)


def bytes_per_element(fmt, element_size: int) -> tuple[float, float]:
    """(fused, unfused) DRAM bytes an element: data and scales (twice with a columnwise
    copy) and, for current scaling, the amax pass's second read of x and the gate."""
    scales = {"block": 4 / 128, "mxfp8": 1 / 32, "tensor": 0.0}[fmt.scaling]
    if fmt.columnwise:
        scales = 2 * scales + 1  # the transposed copy's data and scales
    fused = 2 * element_size + 1 + scales
    if fmt.current_scaling:
        fused += 2 * element_size
    # Unfused: the norm reads x, gate, writes y; the quantizer reads y (twice for current
    # scaling: its amax pass) and writes data and scales.
    unfused = 3 * element_size + element_size * (2 if fmt.current_scaling else 1) + 1 + scales
    return fused, unfused


def te_quantizer(fmt):
    """TransformerEngine's quantizer of ``fmt`` (callable on a bf16 tensor), or None."""
    try:
        import transformer_engine.pytorch as te  # noqa: F401
        import transformer_engine_torch as tex
        from transformer_engine.pytorch.tensor import (
            Float8BlockQuantizer,
            Float8CurrentScalingQuantizer,
            MXFP8Quantizer,
        )
    except Exception:  # noqa: BLE001 (any import failure means "not available")
        return None
    e4m3 = tex.DType.kFloat8E4M3
    if fmt.scaling == "block":
        quantizer = Float8BlockQuantizer(e4m3, rowwise=True, columnwise=fmt.columnwise,
                                         force_pow_2_scales=fmt.power_of_two_scales,
                                         block_scaling_dim=1)
    elif fmt.scaling == "mxfp8":
        quantizer = MXFP8Quantizer(e4m3, rowwise=True, columnwise=fmt.columnwise)
    elif fmt.current_scaling:
        quantizer = Float8CurrentScalingQuantizer(e4m3, device=torch.device("cuda"),
                                                  rowwise=True, columnwise=False)
    else:
        return None
    return quantizer


def make_sets(shape: Shape, device, dtype, count: int):
    sets = []
    for _ in range(count):
        x = torch.randn(shape.tokens, shape.k, device=device, dtype=dtype)
        gate = torch.randn(shape.tokens, shape.k, device=device, dtype=dtype)
        weight = torch.ones(shape.k, device=device, dtype=dtype)
        sets.append((x, gate, weight))
    return sets


def time_case(shape: Shape, name: str, device, budget, copy_gbps: float, smoke: bool,
              compiled_quantizers: dict) -> dict:
    dtype = torch.bfloat16
    fmt = fmt_of(name, device)
    per_set = 2 * shape.tokens * shape.k * 2
    count = 1 if smoke else min(MAX_SETS, max(2, math.ceil(ROTATION_BYTES / per_set)))
    sets = make_sets(shape, device, dtype, count)
    options = dict(group_size=shape.group_size, activation=shape.activation,
                   norm_before_gate=shape.norm_before_gate)

    def fused(x, gate, weight):
        return quantized_rms_norm_gated(x, gate, weight, quantize=fmt, **options)

    if name not in compiled_quantizers:
        def quantize(y, fmt=fmt):
            data, scales, amax = reference_quantize(y, fmt)
            if fmt.columnwise:  # the transposed copy too, as the fused kernel writes it
                return data, scales, amax, *columnwise_quantize(y, fmt)
            return data, scales, amax
        # One code object compiled for every format: more variants than Dynamo's default
        # limit of 8, past which it would time the eager quantizer instead.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        compiled_quantizers[name] = quantize if smoke else torch.compile(quantize,
                                                                        dynamic=True)
    quantizer = compiled_quantizers[name]

    def unfused(x, gate, weight):
        return quantizer(gatednorm.rms_norm_gated(x, gate, weight, **options))

    # Same bits first: the fused output (data, scales, amax, the columnwise copy) must be the
    # eager reference quantization of the op's y; whether the compiled quantizer (Inductor's
    # own division and casts) agrees on the data is recorded.
    x, gate, weight = sets[0]
    with torch.no_grad():  # as timed: one grad mode, one compiled variant
        result = fused(x, gate, weight)
        y = gatednorm.rms_norm_gated(x, gate, weight, **options)
        expected, _, _ = reference_quantize(y, fmt)
        compiled_data = unfused(x, gate, weight)[0]
    wrong = mismatches(result, y)
    status = "ok" if not wrong else "wrong: " + ", ".join(wrong)
    compiled_matches = torch.equal(compiled_data.view(torch.uint8), expected.view(torch.uint8))
    fused_bytes, unfused_bytes = bytes_per_element(fmt, 2)
    elements = shape.tokens * shape.k
    record = dict(case=shape.name, format=name, tokens=shape.tokens, k=shape.k,
                  group_size=shape.group_size, status=status,
                  unfused_compile_matches=compiled_matches,
                  fused_bytes_per_element=fused_bytes, unfused_bytes_per_element=unfused_bytes)
    with torch.no_grad():
        for label, fn in (("fused", fused), ("unfused_compile", unfused)):
            timing = measure([lambda s=s, fn=fn: fn(*s) for s in sets], device, budget)
            record[f"{label}_ms"] = timing.median_ms
        te = None if smoke else te_quantizer(fmt)
        if te is not None:
            try:
                te_calls = [lambda s=s: te(gatednorm.rms_norm_gated(*s, **options))
                            for s in sets]
                record["unfused_te_ms"] = measure(te_calls, device, budget).median_ms
            except Exception as error:  # noqa: BLE001 (TE API drift: record, go on)
                record["unfused_te_error"] = repr(error)[:200]
    fused_gbps = fused_bytes * elements / (record["fused_ms"] * 1e-3) / 1e9
    record["fused_frac_copy"] = fused_gbps / copy_gbps
    # What a copy moving the same bytes in as many launches achieves: the ceiling that the
    # size alone allows (launch ramp-up and last wave included), beside the large copy's.
    if fmt.current_scaling:  # the amax pass reads x and the gate; the second pass the rest
        amax_pass = 2 * 2 * elements
        copies = [amax_pass // 2, (round(fused_bytes * elements) - amax_pass) // 2]
    else:
        copies = [round(fused_bytes * elements) // 2]
    record["same_bytes_copy_ms"] = same_bytes_copy_ms(copies, device, budget)
    record["fused_frac_same_bytes_copy"] = record["same_bytes_copy_ms"] / record["fused_ms"]
    fastest_unfused = min(v for k, v in record.items() if k.startswith("unfused_")
                          and k.endswith("_ms"))
    record["speedup_vs_fastest_unfused"] = fastest_unfused / record["fused_ms"]
    return record


def time_decode(tokens: int, device, smoke: bool) -> dict:
    """Per-forward microseconds inside a CUDA graph: fused 1x128 against the bf16 forward."""
    x = torch.randn(tokens, 4096, device=device, dtype=torch.bfloat16)
    gate = torch.randn_like(x)
    weight = torch.ones(4096, device=device, dtype=torch.bfloat16)
    calls = {
        "bf16_forward": lambda: gatednorm.rms_norm_gated(x, gate, weight, group_size=128),
        "fused_1x128": lambda: quantized_rms_norm_gated(x, gate, weight, quantize="1x128",
                                                        group_size=128),
    }
    record = dict(tokens=tokens, heads=32, head_dim=128)
    for label, call in calls.items():
        if smoke:
            record[f"{label}_us"] = per_call_us(call, device, 2, 1)
        else:
            replay = capture_graph(call, GRAPH_CALLS)
            record[f"{label}_us"] = per_call_us(replay, device, 50, 5) / GRAPH_CALLS
    record["difference_us"] = record["fused_1x128_us"] - record["bf16_forward_us"]
    return record


RECORD_HEADER = (f"{'case':24s} {'format':16s} {'fused us':>9s} {'%copy':>6s} {'%same':>6s} "
                 f"{'unfused us':>11s} {'TE us':>8s} {'speedup':>8s} status")
DECODE_HEADER = f"{'decode tokens':>13s} {'bf16 fwd us':>12s} {'fused us':>9s} {'diff us':>8s}"


def record_line(r: dict) -> str:
    if "fused_ms" not in r:
        return f"{r['case']:24s} {r['format']:16s} {r['status']}"
    te = r.get("unfused_te_ms")
    return (f"{r['case']:24s} {r['format']:16s} {r['fused_ms'] * 1e3:9.1f} "
            f"{100 * r['fused_frac_copy']:6.1f} {100 * r['fused_frac_same_bytes_copy']:6.1f} "
            f"{r['unfused_compile_ms'] * 1e3:11.1f} "
            f"{'-' if te is None else f'{te * 1e3:.1f}':>8s} "
            f"{r['speedup_vs_fastest_unfused']:8.2f} {r['status']}")


def decode_line(r: dict) -> str:
    return (f"{r['tokens']:13d} {r['bf16_forward_us']:12.2f} {r['fused_1x128_us']:9.2f} "
            f"{r['difference_us']:8.2f}")


def _write(results: dict, out: Path | None, device: torch.device, partial: bool) -> Path:
    """Write ``results`` to ``out``, or where the module docstring says; returns the path."""
    if out is None and device.type == "cuda" and not partial:
        out = results_file.default_path(results["gpu"])
        whole = results_file.load(out) or {"format": results_file.FORMAT}
        whole[results_file.QUANTIZED] = results
        results = whole
    elif out is None:
        date = datetime.date.today().isoformat()
        name = f"quantized-{device.type}-{date}.json"
        out = Path(tempfile.gettempdir()) / "gatednorm-bench" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gatednorm.bench.quantized",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path,
                        help="write the results here as a file of their own (default: the "
                             "'quantized' section of benchmarks/results/<gpu>.json for a full "
                             "GPU run, else a file under the temporary directory)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes on the CPU, no timing claims")
    parser.add_argument("--cases", help="comma-separated substrings of case names to keep")
    # python -m gatednorm.bench --quantized passes its arguments without --quantized.
    arguments = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(arguments)
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    budget = SMOKE if args.smoke or device.type == "cpu" else FULL
    smoke = budget is SMOKE
    shapes = SMOKE_SHAPES if smoke else SHAPES
    if args.cases:
        wanted = args.cases.split(",")
        shapes = tuple(s for s in shapes if any(w in s.name for w in wanted))
    copy_gbps = copy_bandwidth_gbps(device, 2**20 if smoke else COPY_BYTES, budget)
    compiled: dict = {}
    # Each line is printed as it is measured, so that a run cut short still shows its numbers;
    # a case that raises is recorded as such and the others still run.
    print(RECORD_HEADER, flush=True)
    records = []
    for shape in shapes:
        for name in FORMATS:
            try:
                record = time_case(shape, name, device, budget, copy_gbps, smoke, compiled)
            except Exception as error:  # noqa: BLE001
                record = dict(case=shape.name, format=name, status=f"error: {error!r}"[:300])
            records.append(record)
            print(record_line(record), flush=True)
    print("\n" + DECODE_HEADER, flush=True)
    decode = []
    for tokens in DECODE_TOKENS[:2 if smoke else None]:
        decode.append(time_decode(tokens, device, smoke))
        print(decode_line(decode[-1]), flush=True)
    results = dict(
        gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        torch=torch.__version__, triton=triton.__version__,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        command=" ".join([sys.executable, "-m", "gatednorm.bench.quantized", *arguments]),
        git_commit=results_file.git_commit(),
        copy_gbps=copy_gbps, smoke=smoke, records=records, decode=decode)
    print(f"\nwrote {_write(results, args.out, device, smoke or bool(args.cases))}")
    return 0 if all(r["status"] == "ok" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
