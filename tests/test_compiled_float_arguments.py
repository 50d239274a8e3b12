"""A compiled call computes what an eager call does, in the same order.

Triton's launcher passes a Python float to a kernel as fp32. Inductor passes the same float to
a user-defined kernel (ours, under torch.compile) as fp64 (torch >= 2.10), and Triton promotes
``fp32 tensor + fp64 scalar`` to fp64: rstd, and y with it, would be computed in fp64 and come
out with other bits than the eager call's. Inductor also specializes the integer arguments on
their values (multiples of 16, ones) where the eager launch does not, and what the compiler
infers about addresses chooses the register layout, which fixes the order of every sum (the
FP8 kernels' layout followed the store of Q, whose row stride k Inductor knew).

Without a GPU, each kernel launch is compiled for sm_90 (Triton's own ptxas) twice: as the
eager launch makes it and as Inductor does (eps fp64, integers specialized): the launcher's
own plans (``describe.kernel_launches``) for each family of tiles, and the FP8 kernels in
configurations written out. Both must have no fp64 arithmetic in their PTX, the same float
operations in their TTIR (but the one conversion of eps), and every reduction in the same
layout in their TTGIR. In subprocesses with TRITON_INTERPRET=0 (the flag is read at import).
"""

import itertools
import os
import re
import subprocess
import sys

import pytest

# The launcher's own plans (gatednorm.kernels.describe.kernel_launches), eager and traced, for
# each family of tiles; every entry is checked norm first in bf16 ("te"), gate first in bf16
# ("hf") and in fp32 ("fp32"), each pass.
TOKENS = 4096
PLANNED = {
    "D = 64": dict(x_shape=(TOKENS * 8, 64)),
    "D = 96 (head + tail)": dict(x_shape=(TOKENS * 4, 96)),
    "Gated DeltaNet 32 x 128": dict(x_shape=(TOKENS, 32, 128)),
    "Gated DeltaNet, gate sliced from a projection": dict(
        x_shape=(TOKENS, 32, 128), gate_strides=(3 * 32 * 128, 128, 1)),
    "[B, S, H, D] view of [B, H, S, D]": dict(
        x_shape=(2, TOKENS // 2, 8, 128),
        strides=(8 * (TOKENS // 2) * 128, 128, (TOKENS // 2) * 128, 1)),
    "D = 256": dict(x_shape=(TOKENS, 256)),
    "Mamba2 5120 in groups of 640": dict(x_shape=(TOKENS, 5120), group_size=640),
    "D = 2048": dict(x_shape=(TOKENS, 2048)),
    "D = 8192": dict(x_shape=(TOKENS, 8192)),
    "D = 16384 (row loop)": dict(x_shape=(TOKENS, 16384)),
    "D = 32768 (long rows, two-launch backward)": dict(x_shape=(TOKENS, 32768)),
    "D = 1": dict(x_shape=(TOKENS, 1)),
}
OPTIONS = (dict(dtype="bfloat16", norm_before_gate=True, rounding="te"),
           dict(dtype="bfloat16", norm_before_gate=False, rounding="hf"),
           dict(dtype="float32", norm_before_gate=True, rounding="fp32"))
# With D = 1 every stride is 1; Inductor passes it as the constant 1, so the compiler knows
# that a tile's rows are adjacent and loads them together, where the eager launch (strides
# not specialized) loads one a lane. Each row's own sums have one element either way, so y,
# dx and dgate keep their bits; the sum over the tile's rows into dweight changes its order
# (its last bits may differ between a compiled and an eager backward, within fp64 tolerance).
ROWS_ADJACENT_UNDER_INDUCTOR = {"D = 1"}

# The FP8 kernels, written out (their launcher plans per format).
QUANTIZED_BASE = dict(LEADING_DIMS=1, ROW_ALIGN=8, HAS_WEIGHT=True, ZERO_CENTERED=False,
                      ACTIVATION=0, NORM_BEFORE_GATE=True, ROUNDING=0,
                      WEIGHT_PRODUCT_ROUNDED=True, STORE_RSTD=True, BLOCK_ROWS=16, BLOCK_N=128,
                      TAIL_N=0, GROUPS_PER_TILE=1, QUANT_BLOCK=128, SCALE_KIND=0,
                      SWIZZLED=False, SCALE_WORDS=False, ROUND_Y=True, STORES_BY_PTX=False,
                      num_warps=4)
FUSED = dict(QUANTIZED_BASE, AMAX_ONLY=False)
# (module, kernel, constexprs, width, group size)
QUANTIZED = {
    "FP8 output, 1x128 blocks": (
        "gatednorm.quantize.kernels", "quantized_forward_kernel", FUSED, 4096, 128),
    "FP8 output, MXFP8 swizzled": (
        "gatednorm.quantize.kernels", "quantized_forward_kernel",
        dict(FUSED, SCALE_KIND=2, QUANT_BLOCK=32, SWIZZLED=True, SCALE_WORDS=True), 4096, 128),
    "FP8 output, per-tensor scale, Mamba2 gate first": (
        "gatednorm.quantize.kernels", "quantized_forward_kernel",
        dict(FUSED, SCALE_KIND=3, QUANT_BLOCK=1, BLOCK_ROWS=1, BLOCK_N=512, TAIL_N=128,
             NORM_BEFORE_GATE=False, ROUNDING=2, num_warps=1), 5120, 640),
    "FP8 output with columnwise copy": (
        "gatednorm.quantize.columnwise", "quantized_forward_columnwise_kernel",
        {**{k: v for k, v in QUANTIZED_BASE.items() if k != "BLOCK_ROWS"}, "QT_ALIGN": 16,
         "num_warps": 8}, 4096, 128),
}
KERNEL_PACKAGES = ("gatednorm.kernels", "gatednorm.quantize")
POINTER_TYPES = dict(RSTD="*fp32", DW_PARTIAL="*fp32", ROW_DOTS="*fp32", Q="*u8", QT="*u8",
                     SCALE="*fp32", SCALE_T="*fp32", TENSOR_SCALE="*fp32", AMAX="*fp32")
ROWS = 131072  # Gated DeltaNet's 4096 tokens x 32 heads


def _quantized_integers(kernel, width: int, group_size: int) -> dict:
    """The integer arguments of an FP8 kernel for a contiguous [ROWS, width] call (one leading
    dim: rows step by stride 2)."""
    return {name: _integer_value(name, width, group_size) for name in kernel.arg_names
            if not name.isupper() and name != "eps"
            and not any(p.name == name and p.is_constexpr for p in kernel.params)}


def _integer_value(name: str, width: int, group_size: int) -> int:
    tensor_stride = re.fullmatch(r"stride_[a-z]+([012])", name)
    if tensor_stride:
        return width if tensor_stride.group(1) == "2" else 0
    return dict(rows=ROWS, size1=1, size2=ROWS, group_size=group_size,
                num_groups=width // group_size, k=width, stride_scale_row=width // 128,
                stride_scale_col=1, scale_col_tiles=max(1, width // 512),
                token_blocks=ROWS // 128)[name]


LAUNCH_OPTIONS = ("num_warps", "maxnreg")


def _compile(kernel, constexprs: dict, integers: dict, inductor: bool,
             data: str = "*bf16"):
    """The compiled ``kernel``'s TTIR, TTGIR and PTX (``.asm``), its arguments typed and
    specialized as Triton's launcher does for the eager call (integers equal to 1 become
    constants, multiples of 16 are marked so, except those in the kernel's do_not_specialize)
    or as Inductor's generated code does (every integer specialized so, eps fp64). ``data``:
    the type of x, the gate and their likes."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    # Launch options ride in ``constexprs`` as the launcher passes them (num_warps, and the
    # columnwise kernels' register cap).
    options = {"num_warps": 4} | {k: v for k, v in constexprs.items() if k in LAUNCH_OPTIONS}
    signature, attrs = {}, {}
    constants = {k: v for k, v in constexprs.items() if k not in LAUNCH_OPTIONS}
    unspecialized = {kernel.arg_names[i] if isinstance(i, int) else i
                     for i in kernel.do_not_specialize}
    for index, name in enumerate(kernel.arg_names):
        if name in constants:
            signature[name] = "constexpr"
        elif name.isupper():
            signature[name] = POINTER_TYPES.get(name, data)
            attrs[(index,)] = [["tt.divisibility", 16]]
        elif name == "eps":
            signature[name] = "fp64" if inductor else "fp32"
        else:
            value = integers[name]
            signature[name] = "i32"
            if inductor or name not in unspecialized:
                if value == 1:
                    signature[name], constants[name] = "constexpr", 1
                elif value % 16 == 0:
                    attrs[(index,)] = [["tt.divisibility", 16]]
    compiled = triton.compile(ASTSource(kernel, signature, constants, attrs),
                              target=GPUTarget("cuda", 90, 32), options=options)
    return compiled.asm


def _fp64_instructions(ptx: str) -> list[str]:
    """Opcodes of the PTX instructions on fp64 values, comparisons aside."""
    opcodes = (re.match(r"(?:@!?%p\d+\s+)?([a-z][\w.]*)", line.strip())
               for line in ptx.splitlines())
    return [m.group(1) for m in opcodes
            if m and ".f64" in m.group(1) and not m.group(1).startswith("setp.")]


def _float_ops(ttir: str) -> list[str]:
    """The float operations of the kernel body with their types, in program order (TTIR:
    before layouts and software pipelining, which repeat a loop's ops per stage)."""
    ops = []
    for line in ttir.splitlines():
        m = re.match(r"\s*%\S+ = (arith\.\w+|math\.\w+)\b.*?:\s*(.*?)\s*loc\(", line)
        if m and re.search(r"f(16|32|64)", m.group(2)) and m.group(1) != "arith.constant":
            ops.append(f"{m.group(1)} : {re.sub(r'tensor<[0-9x]+', 'tensor<', m.group(2))}")
    return ops


def _reductions(ttgir: str) -> set[tuple[str, str, str]]:
    """(axis, combining op, operand type with its layout written out) of every reduction:
    the layout of a reduction's operand fixes the order in which it adds."""
    layouts = dict(re.findall(r"^(#\w+) = (.*)$", ttgir, flags=re.M))
    found = set()
    for m in re.finditer(r'"tt\.reduce"\(.*?<\{axis = (\d+).*?\n(.*?)\}\) : \((.*?)\) ->',
                         ttgir, flags=re.S):
        combine = " ".join(sorted(set(re.findall(r"(arith\.\w+|math\.\w+)", m.group(2)))))
        operand = re.sub(r"#\w+", lambda name: layouts.get(name.group(0), name.group(0)),
                         m.group(3))
        found.add((m.group(1), combine, operand))
    return found


def _kernels_taking_eps() -> set[str]:
    import importlib
    import pkgutil

    import triton

    found = set()
    for package_name in KERNEL_PACKAGES:
        package = importlib.import_module(package_name)
        for info in pkgutil.iter_modules(package.__path__):
            module = importlib.import_module(f"{package_name}.{info.name}")
            for value in vars(module).values():
                if (isinstance(value, triton.runtime.JITFunction)
                        and value.__name__.endswith("_kernel") and "eps" in value.arg_names):
                    found.add(f"{value.__module__}.{value.__name__}")
    return found


def _compare(case: str, eager, traced, rows_adjacent: bool = False) -> None:
    """Assert that the traced compilation computes what the eager one does, in its order."""
    fp64 = _fp64_instructions(traced["ptx"])
    assert fp64 in ([], ["cvt.rn.f32.f64"]), f"{case}: fp64 arithmetic under Inductor: {fp64}"
    traced_ops = _float_ops(traced["ttir"])
    if "arith.truncf : f64 to f32" in traced_ops:  # eps, where the kernel reads it
        traced_ops.remove("arith.truncf : f64 to f32")
    assert traced_ops == _float_ops(eager["ttir"]), f"{case}: other float operations"
    reductions = _reductions(eager["ttgir"])
    assert reductions, f"{case}: no reduction found in the TTGIR (has its format changed?)"
    changed = _reductions(traced["ttgir"]) ^ reductions
    if rows_adjacent:
        # Only sums over the rows (axis 0: dweight) or over one-element rows.
        changed = {r for r in changed if r[0] != "0" and not re.search(r"<\d+x1xf32", r[2])}
    assert not changed, f"{case}: reductions in other layouts: {sorted(changed)}"


def check_planned(case: str) -> None:
    import torch

    from gatednorm.kernels.describe import kernel_launches

    for options, pass_ in itertools.product(OPTIONS, ("forward", "backward")):
        arguments = dict(PLANNED[case], **options, pass_=pass_)
        arguments["dtype"] = getattr(torch, arguments["dtype"])
        label = f"{case}, {pass_}, {options}"
        eager = kernel_launches(**arguments)
        traced = kernel_launches(**arguments, traceable=True)
        assert len(eager) == len(traced), label
        data = "*fp32" if arguments["dtype"] == torch.float32 else "*bf16"
        for e, t in zip(eager, traced):
            _compare(label, _compile(e.kernel, e.constexprs, e.integers, False, data),
                     _compile(t.kernel, t.constexprs, t.integers, True, data),
                     rows_adjacent=case in ROWS_ADJACENT_UNDER_INDUCTOR)


def check_quantized(case: str) -> None:
    import importlib

    module, name, constexprs, width, group_size = QUANTIZED[case]
    kernel = getattr(importlib.import_module(module), name)
    integers = _quantized_integers(kernel, width, group_size)
    _compare(case, _compile(kernel, constexprs, integers, inductor=False),
             _compile(kernel, constexprs, integers, inductor=True))


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET="0")
    return subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True,
                          text=True, timeout=600)


def test_every_kernel_taking_eps_is_checked():
    proc = _run("--list")
    assert proc.returncode == 0, proc.stderr[-4000:]
    checked = {f"{module}.{name}" for module, name, *_ in QUANTIZED.values()} | {
        f"gatednorm.kernels.{name}" for name in ("forward.forward_tile_kernel",
                                                 "forward.forward_row_loop_kernel",
                                                 "forward.forward_long_row_kernel",
                                                 "backward.backward_tile_kernel")}
    assert set(proc.stdout.split()) == checked


@pytest.mark.parametrize("case", PLANNED)
def test_compiled_kernels_compute_like_the_eager_ones(case):
    proc = _run("planned", case)
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.mark.parametrize("case", QUANTIZED)
def test_compiled_fp8_kernels_compute_like_the_eager_ones(case):
    proc = _run("quantized", case)
    assert proc.returncode == 0, proc.stderr[-4000:]


if __name__ == "__main__":
    if sys.argv[1] == "--list":
        print("\n".join(sorted(_kernels_taking_eps())))
    elif sys.argv[1] == "planned":
        check_planned(sys.argv[2])
    else:
        check_quantized(sys.argv[2])
