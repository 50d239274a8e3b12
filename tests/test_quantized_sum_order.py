"""The fused FP8 kernels add each group's sum of squares in the op's order (no GPU needed).

The quantized output is bit for bit the quantization of the op's y only if the fused kernel's
rstd has the op's bits, that is if its sum of squares adds in the same order. The fused
kernels run the op's tile for the group size, but the compiler lays out each kernel's
registers from the whole kernel (its stores included), and a layout with other lanes along a
row adds in another order. The interpreter cannot see this (it sums with NumPy). Here the
op's forward and the fused kernel, as their launchers plan them, are compiled for sm_90 and
every summing reduction compared: the extent of the summed axis, and its elements per thread,
threads and warps along it.
"""

import os
import re
import subprocess
import sys

import pytest

# (x shape, group size, format, dtype, norm before gate, rounding)
CASES = {
    "GDN 1x128": ((4096, 32 * 128), 128, "1x128", "bfloat16", True, "te"),
    "GDN MXFP8": ((4096, 32 * 128), 128, "mxfp8", "bfloat16", True, "te"),
    "GDN 1x128 columnwise": ((4096, 32 * 128), 128, "1x128_columnwise", "bfloat16", True, "te"),
    "GDN MXFP8 columnwise": ((4096, 32 * 128), 128, "mxfp8_columnwise", "bfloat16", True,
                             "te"),
    "GDN fp16 1x128 columnwise": ((4096, 32 * 128), 128, "1x128_columnwise", "float16", True,
                                  "fp32"),
    "GDN decode tile": ((1, 32 * 128), 128, "1x128", "bfloat16", True, "te"),
    "D = 64 pairs 1x128": ((4096, 32 * 64), 64, "1x128", "bfloat16", True, "te"),
    "D = 64 pairs columnwise": ((4096, 32 * 64), 64, "1x128_columnwise", "bfloat16", True,
                                "te"),
    "Mamba2 fp16 1x128": ((2048, 5120), 640, "1x128", "float16", False, "fp32"),
    "Mamba2 per-tensor": ((2048, 5120), 640, "per_tensor", "bfloat16", False, "hf"),
    "Nemotron-H 1x128": ((1024, 8192), 1024, "1x128", "bfloat16", False, "te"),
    "D = 96 MXFP8 head + tail": ((1000, 32 * 96), 96, "mxfp8", "bfloat16", True, "te"),
}


def _summed_axes(ttgir: str) -> set[tuple[int, int, int, int]]:
    """(extent, elements a thread, threads, warps) along the summed axis of every sum."""
    from test_compiled_float_arguments import _reductions

    found = set()
    for axis, combine, operand in _reductions(ttgir):
        if combine != "arith.addf":
            continue
        axis = int(axis)
        shape = [int(n) for n in re.search(r"tensor<([\dx]+)xf32", operand).group(1).split("x")]
        per_thread, threads, warps = (
            [int(n) for n in re.search(rf"{name} = \[([\d, ]+)\]", operand).group(1).split(",")]
            for name in ("sizePerThread", "threadsPerWarp", "warpsPerCTA"))
        found.add((shape[axis], per_thread[axis], threads[axis], warps[axis]))
    return found


def check(case: str) -> None:
    import torch

    from gatednorm.kernels.describe import kernel_launches
    from gatednorm.quantize import as_format
    from gatednorm.quantize.launch import fused_kernel_tiling, fused_plan, few_rows_tiling
    from test_compiled_float_arguments import _compile, _quantized_integers

    x_shape, group, name, dtype_name, norm_before_gate, rounding = CASES[case]
    dtype = getattr(torch, dtype_name)
    data = "*fp16" if dtype == torch.float16 else "*bf16"
    options = dict(norm_before_gate=norm_before_gate, rounding=rounding)
    (op,) = kernel_launches(x_shape, dtype, group_size=group, pass_="forward", **options)
    fmt = as_format(name)
    rows, width = x_shape
    tiling = fused_kernel_tiling(group, width // group, fmt)
    assert tiling is not None, f"{case}: not fused"
    if not fmt.columnwise:
        tiling = few_rows_tiling(tiling, group, rows, width // group)
    x = torch.empty(x_shape, dtype=dtype, device="meta")
    weight = torch.empty(width, dtype=dtype, device="meta")
    plan = fused_plan(x, x, weight, fmt, tiling, group_size=group, zero_centered_gamma=False,
                      activation="silu", store_rstd=True, traceable=False, **options)
    meta = dict(plan.meta) if fmt.columnwise else dict(plan.meta, AMAX_ONLY=False)
    fused = _compile(plan.kernel, meta, _quantized_integers(plan.kernel, width, group),
                     False, data)
    expected = _summed_axes(_compile(op.kernel, op.constexprs, op.integers, False, data)["ttgir"])
    got = _summed_axes(fused["ttgir"])
    assert expected, f"{case}: no sum found in the op's kernel"
    assert got == expected, f"{case}: the fused kernel sums {got}, the op {expected}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_kernels_sum_each_group_in_the_ops_order(case):
    env = dict(os.environ, TRITON_INTERPRET="0")
    proc = subprocess.run([sys.executable, __file__, case], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    check(sys.argv[1])
