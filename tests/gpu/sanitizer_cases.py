"""Every kernel variant once (forward with and without rstd, backward, the dweight reduction, the
FP8-output kernels in every format), on small odd shapes: the compute-sanitizer run.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck  python tests/gpu/sanitizer_cases.py
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool racecheck python tests/gpu/sanitizer_cases.py

(scripts/run_gpu_suite.sh runs it once plainly first, which fills the Triton cache: the sanitized
runs then load the kernels instead of compiling them.) Without the caching allocator every
tensor is its own cudaMalloc, so an out-of-bounds access cannot hide inside a cached block.
Inputs are drawn on the CPU and copied over, and results are checked on the CPU against the
fp64 composite with the suite's accuracy rule (the FP8 outputs bit for bit against the reference
quantization of the op's y), so nearly every kernel the sanitizer sees is one of ours. Exits 1
if a result is wrong, 2 without CUDA.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE)]

import torch  # noqa: E402

import gatednorm  # noqa: E402
from gatednorm import reference  # noqa: E402
from gatednorm.kernels import config, launch  # noqa: E402
from gatednorm.kernels import plan as planner  # noqa: E402
from gatednorm.quantize import FORMAT_NAMES, per_tensor  # noqa: E402
from gatednorm.quantize.launch import fused_tiling  # noqa: E402
from gatednorm.quantize.reference import mismatches  # noqa: E402
from helpers import (  # noqa: E402
    BF16,
    BF16_GATE_FP32,
    FP16,
    FP32_GATE_BF16,
    Case,
    Inputs,
    Options,
    forward_backward,
    make_inputs,
    measure,
    same_bits,
)

CASES = (
    Case("tile d128 rows199", (199, 128), Options("te")),
    # Rows starting at multiples of 4 elements only: 8-byte vectors (layout.row_align 4).
    Case("tile d100 rows199", (199, 100), Options("te")),
    # 3000 rows: 188 row chunks, so the dweight reduction runs in two levels.
    Case("tile d128 rows3000, two-level dweight reduction", (3000, 128), Options("te")),
    Case("narrow tile d3 rows1", (1, 3), Options("hf", activation="sigmoid", weight="fp32")),
    Case("tile d80 rows199 gate-first sliced gate", (199, 80),
         Options("te", norm_before_gate=False), layout="projection"),
    Case("tile 3 groups sliced [T,S,D] gate", (7, 33, 384),
         Options("fp32", zero_centered=True), BF16, 128, "projection"),
    Case("tile permuted [B,S,H,D]", (2, 5, 3, 64), Options("te"), layout="permuted"),
    Case("tile fp16 gate-first", (199, 128), Options("hf", norm_before_gate=False), FP16),
    Case("tile fp32 d96 bf16 gate", (199, 96), Options("fp32", activation="sigmoid"),
         FP32_GATE_BF16),
    Case("one-row tiles d5000", (5, 5000), Options("te")),
    # The 2048-wide backward tile on four warps (variant 52), 37 rows: three chunks.
    Case("one-row tiles d2048 rows37", (37, 2048), Options("te")),
    Case("one-row tiles d1536 rows37 gate-first", (37, 1536),
         Options("hf", norm_before_gate=False)),
    Case("wide tile d9000 gate-first fp32 gate", (3, 9000),
         Options("fp32", norm_before_gate=False, weight="none"), BF16_GATE_FP32),
    # 40 rows: three row chunks, each program looping over its rows.
    Case("long rows d20000 rows40", (40, 20000), Options("te")),
    Case("long rows 2 groups of 20000 gate-first", (2, 40000),
         Options("hf", norm_before_gate=False, weight="fp32", zero_centered=True), BF16, 20000),
    # Forward row loop of a group held as a 128 head and a 64 tail: 16-row tiles, chunks of
    # several, the last chunk short.
    Case("row loop d192 rows70001 sliced gate", (70001, 192),
         Options("te", activation="sigmoid"), layout="projection"),
    # Groups of 640 held as a 512 head and a 128 tail in the one-tile kernel (Mamba2), and in
    # the backward with 8-byte vectors (row offsets stepped in units of 4 elements).
    Case("head + tail tile 2 groups of 640 gate-first", (37, 1280),
         Options("te", norm_before_gate=False), BF16, 640),
)
# Run with the decode tile on (plan.few_rows_forward_config); CASES run without it, since
# their small shapes would otherwise all take it and leave the table's tiles unsanitized.
DECODE_CASES = (
    Case("decode tile 1x32x128 sliced gate", (1, 32, 128), Options("te"), layout="projection"),
    Case("decode tile d112 rows5 gate-first", (5, 112), Options("hf", norm_before_gate=False)),
)

# (name, rows, K, group, norm_before_gate): partial row tiles and partial 128/32-token column
# blocks (37 rows), Mamba2's 640-wide groups gate-first, a decode row count, and a group width
# the fused kernel does not tile (96: the norm, then the quantize kernel on its y). 160 rows:
# a whole and a partial 128-token block, the transposed copy stored 16 tokens at a time.
QUANTIZED_SHAPES = (
    ("fp8 37x384 groups of 128", 37, 384, 128, True),
    ("fp8 160x3072 groups of 96 (unfused)", 160, 3072, 96, True),
    ("fp8 37x1280 groups of 640 gate-first", 37, 1280, 640, False),
    ("fp8 decode 3x4096 groups of 128", 3, 4096, 128, True),
    ("fp8 37x3072 groups of 96 (unfused)", 37, 3072, 96, True),
)


def run_quantized(rows: int, k: int, group: int, norm_before_gate: bool) -> list[str]:
    failures = []
    host = [torch.randn(rows, k) for _ in range(2)] + [1 + 0.2 * torch.randn(k)]
    x, gate, weight = (t.to("cuda", torch.bfloat16) for t in host)
    options = dict(group_size=group, norm_before_gate=norm_before_gate)
    y = gatednorm.rms_norm_gated(x, gate, weight, **options)
    for name in (*FORMAT_NAMES, "delayed"):
        fmt = per_tensor(torch.tensor([0.01], device="cuda")) if name == "delayed" else name
        result = gatednorm.rms_norm_gated(x, gate, weight, quantize=fmt, **options)
        wrong = mismatches(result, y)
        if wrong:
            failures.append(f"{name}: {', '.join(wrong)} differ from the reference")
    return failures


def kernel_paths(case: Case) -> str:
    group = case.group_size or case.shape[-1]
    rows = 1
    for size in case.shape[:-1]:
        rows *= size
    fwd = planner.few_rows_forward_config(config.forward_config(group), rows,
                                          case.shape[-1] // group)
    bwd = config.backward_config(group)

    def name(launch_config, loop_name):
        if launch_config.long_row:
            return f"long-row, columns in blocks of {launch_config.block_n}"
        kind = loop_name if launch_config.loop_stages > 1 else "tile"
        return f"{kind} {launch_config.block_rows}x{launch_config.block_n}"

    return f"forward {name(fwd, 'row loop')}, backward {name(bwd, 'tile')}"


def run(case: Case) -> list[str]:
    inputs = make_inputs(case.shape, case.dtypes, case.options, layout=case.layout,
                         host_random=True)
    kwargs = case.options.kwargs(case.group_size)
    kernel = {name: t.cpu() for name, t in
              forward_backward(gatednorm.rms_norm_gated, inputs, kwargs).items()}
    with torch.no_grad():  # the forward-only variant, which stores no rstd
        inference = gatednorm.rms_norm_gated(inputs.x, inputs.gate, inputs.weight, **kwargs)
    host = Inputs(inputs.x.cpu(), inputs.gate.cpu(),
                  None if inputs.weight is None else inputs.weight.cpu(), inputs.dy.cpu())
    composite = forward_backward(reference.rms_norm_gated, host, kwargs)
    exact = forward_backward(reference.rms_norm_gated, host.double(),
                             dict(kwargs, rounding="fp32"))
    failures = [] if same_bits(inference.cpu(), kernel["y"]) else ["inference y != training y"]
    for name, tensor in kernel.items():
        if not torch.isfinite(tensor).all():
            failures.append(f"{name} is not finite")
            continue
        result = measure(name, tensor, composite[name], exact[name], case.dtypes.x, host.rows)
        if not result.ok:
            failures.append(result.describe())
    return failures


def main() -> int:
    if not torch.cuda.is_available():
        print("sanitizer_cases.py needs a CUDA device")
        return 2
    torch.manual_seed(0)
    wrong = 0
    decode_few_programs = config.FORWARD_FEW_PROGRAMS
    for case in CASES + DECODE_CASES:
        config.FORWARD_FEW_PROGRAMS = decode_few_programs if case in DECODE_CASES else 0
        launch.clear_cache()
        start = time.perf_counter()
        failures = run(case)
        torch.cuda.synchronize()
        status = "FAIL" if failures else "ok"
        print(f"{status:4} {case.name:45} {kernel_paths(case):40} "
              f"{time.perf_counter() - start:6.1f}s", flush=True)
        for failure in failures:
            print(f"     {failure}")
        wrong += bool(failures)
    config.FORWARD_FEW_PROGRAMS = decode_few_programs
    for name, rows, k, group, norm_before_gate in QUANTIZED_SHAPES:
        launch.clear_cache()
        start = time.perf_counter()
        failures = run_quantized(rows, k, group, norm_before_gate)
        torch.cuda.synchronize()
        tiled = fused_tiling(group, k // group, 128) is not None
        fused = "fused" if tiled else "norm, then quantize"
        status = "FAIL" if failures else "ok"
        print(f"{status:4} {name:45} {fused:40} {time.perf_counter() - start:6.1f}s",
              flush=True)
        for failure in failures:
            print(f"     {failure}")
        wrong += bool(failures)
    total = len(CASES) + len(DECODE_CASES) + len(QUANTIZED_SHAPES)
    print(f"{total - wrong}/{total} cases right")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
