"""A compiled call computes what an eager call does, in the same order.

Triton's launcher passes a Python float to a kernel as fp32. Inductor passes the same float to
a user-defined kernel (ours, under torch.compile) as fp64 (torch >= 2.10), and Triton promotes
``fp32 tensor + fp64 scalar`` to fp64: rstd, and y with it, would be computed in fp64 and come
out with other bits than the eager call's. Inductor also specializes the integer arguments on
their values (multiples of 16, ones) where the eager launch does not, and what the compiler
infers about addresses chooses the register layout, which fixes the order of every sum (the
FP8 kernels' layout followed the store of Q, whose row stride k Inductor knew).

Without a GPU, each kernel that takes ``eps`` is compiled for sm_90 (Triton's own ptxas) twice:
as the eager launch calls it and as Inductor does (eps fp64, integers specialized). Both must
have no fp64 arithmetic in their PTX, the same float operations in their TTIR (but the one
conversion of eps), and every reduction in the same layout in their TTGIR. In a subprocess
with TRITON_INTERPRET=0 (the flag is read at import)."""

import os
import re
import subprocess
import sys

import pytest

TILE = dict(LEADING_DIMS=1, ROW_ALIGN=8, HAS_WEIGHT=True, ZERO_CENTERED=False, ACTIVATION=0,
            NORM_BEFORE_GATE=True, ROUNDING=0, WEIGHT_PRODUCT_ROUNDED=True)
FORWARD = dict(TILE, STORE_RSTD=True)
QUANTIZED = dict(FORWARD, BLOCK_ROWS=16, BLOCK_N=128, TAIL_N=0, GROUPS_PER_TILE=1,
                 QUANT_BLOCK=128, SCALE_KIND=0, SWIZZLED=False, ROUND_Y=True)
BACKWARD = dict(TILE, TAIL_N=0, LOOP_STAGES=3, GATE_ROWS_AS_X=True, DY_ROWS_AS_X=True,
                DX_ROWS_AS_X=True, DGATE_ROWS_AS_X=True, SPLIT_PASS=0, DOT_BLOCKS=1,
                WAIT_FOR_PRIOR_GRID=False)
# (module, kernel, constexprs, num_warps, width, group size): tiles the launcher plans.
CASES = {
    "forward tile, Gated DeltaNet": (
        "gatednorm.kernels.forward", "forward_tile_kernel",
        dict(FORWARD, BLOCK_ROWS=16, BLOCK_N=128, TAIL_N=0, RSTD_BY_PTX=True,
             GATE_ROWS_AS_X=True, Y_ROWS_AS_X=True), 4, 128, 128),
    "forward head + tail, Mamba2 gate first": (
        "gatednorm.kernels.forward", "forward_tile_kernel",
        dict(FORWARD, BLOCK_ROWS=1, BLOCK_N=512, TAIL_N=128, NORM_BEFORE_GATE=False,
             RSTD_BY_PTX=False, GATE_ROWS_AS_X=False, Y_ROWS_AS_X=False), 1, 5120, 640),
    "forward row loop": (
        "gatednorm.kernels.forward", "forward_row_loop_kernel",
        dict(FORWARD, BLOCK_ROWS=1, BLOCK_N=2048, TAIL_N=0, LOOP_STAGES=3), 4, 2048, 2048),
    "forward long row": (
        "gatednorm.kernels.forward", "forward_long_row_kernel",
        dict(FORWARD, BLOCK_ROWS=1, BLOCK_N=1024, LOOP_STAGES=1), 4, 8192, 8192),
    "backward tile, Gated DeltaNet": (
        "gatednorm.kernels.backward", "backward_tile_kernel",
        dict(BACKWARD, BLOCK_ROWS=4, BLOCK_N=128), 1, 4096, 128),
    "backward, D = 1 (eps in dx)": (
        "gatednorm.kernels.backward", "backward_tile_kernel",
        dict(BACKWARD, BLOCK_ROWS=512, BLOCK_N=1, ROW_ALIGN=1), 1, 1, 1),
    "FP8 output, 1x128 blocks": (
        "gatednorm.quantize.kernels", "quantized_forward_kernel",
        dict(QUANTIZED, AMAX_ONLY=False), 4, 4096, 128),
    "FP8 output, MXFP8 swizzled": (
        "gatednorm.quantize.kernels", "quantized_forward_kernel",
        dict(QUANTIZED, AMAX_ONLY=False, SCALE_KIND=2, QUANT_BLOCK=32, SWIZZLED=True), 4, 4096,
        128),
    "FP8 output, per-tensor scale, Mamba2 gate first": (
        "gatednorm.quantize.kernels", "quantized_forward_kernel",
        dict(QUANTIZED, AMAX_ONLY=False, SCALE_KIND=3, QUANT_BLOCK=1, BLOCK_ROWS=1, BLOCK_N=512,
             TAIL_N=128, NORM_BEFORE_GATE=False, ROUNDING=2), 1, 5120, 640),
    "FP8 output with columnwise copy": (
        "gatednorm.quantize.columnwise", "quantized_forward_columnwise_kernel", QUANTIZED, 4,
        4096, 128),
}
# With D = 1 every stride is 1; Inductor passes it as the constant 1, so the compiler knows
# that a tile's rows are adjacent and loads them 8 at a time, where the eager launch (strides
# not specialized) loads one a lane. Each row's own sums have one element either way, so y,
# dx and dgate keep their bits; the sum over the tile's rows into dweight changes its order
# (its last bits may differ between a compiled and an eager backward, within fp64 tolerance).
ROWS_ADJACENT_UNDER_INDUCTOR = {"backward, D = 1 (eps in dx)"}
KERNEL_PACKAGES = ("gatednorm.kernels", "gatednorm.quantize")
POINTER_TYPES = dict(RSTD="*fp32", DW_PARTIAL="*fp32", ROW_DOTS="*fp32", Q="*u8", QT="*u8",
                     SCALE="*fp32", SCALE_T="*fp32", TENSOR_SCALE="*fp32", AMAX="*fp32")
ROWS = 131072  # Gated DeltaNet's 4096 tokens x 32 heads


def _integer_value(name: str, width: int, group_size: int) -> int:
    """The value the launcher passes for an integer argument in a contiguous [ROWS, width]
    call (one leading dim: rows step by stride 2)."""
    tensor_stride = re.fullmatch(r"stride_[a-z]+([012])", name)
    if tensor_stride:
        return width if tensor_stride.group(1) == "2" else 0
    return dict(rows=ROWS, size1=1, size2=ROWS, group_size=group_size,
                num_groups=width // group_size, column_blocks=width // group_size,
                rows_per_chunk=128, weight_size=width, k=width, stride_scale_row=width // 128,
                stride_scale_col=1, scale_col_tiles=max(1, width // 512),
                token_blocks=ROWS // 128)[name]


def _compile(kernel, constexprs: dict, num_warps: int, width: int, group_size: int,
             inductor: bool):
    """The compiled ``kernel``'s TTIR, TTGIR and PTX (``.asm``), its arguments typed and specialized as Triton's launcher
    does for the eager call (integers equal to 1 become constants, multiples of 16 are marked
    so, except those in the kernel's do_not_specialize) or as Inductor's generated code does
    (every integer specialized so, eps fp64)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature, attrs, constants = {}, {}, dict(constexprs)
    unspecialized = {kernel.arg_names[i] if isinstance(i, int) else i
                     for i in kernel.do_not_specialize}
    for index, name in enumerate(kernel.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.isupper():
            signature[name] = POINTER_TYPES.get(name, "*bf16")
            attrs[(index,)] = [["tt.divisibility", 16]]
        elif name == "eps":
            signature[name] = "fp64" if inductor else "fp32"
        else:
            value = _integer_value(name, width, group_size)
            signature[name] = "i32"
            if inductor or name not in unspecialized:
                if value == 1:
                    signature[name], constants[name] = "constexpr", 1
                elif value % 16 == 0:
                    attrs[(index,)] = [["tt.divisibility", 16]]
    compiled = triton.compile(ASTSource(kernel, signature, constants, attrs),
                              target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=num_warps))
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


def check(case: str) -> None:
    import importlib

    module, name, constexprs, num_warps, width, group_size = CASES[case]
    kernel = getattr(importlib.import_module(module), name)
    shape = (kernel, constexprs, num_warps, width, group_size)
    eager = _compile(*shape, inductor=False)
    traced = _compile(*shape, inductor=True)
    fp64 = _fp64_instructions(traced["ptx"])
    assert fp64 in ([], ["cvt.rn.f32.f64"]), f"{case}: fp64 arithmetic under Inductor: {fp64}"
    traced_ops = _float_ops(traced["ttir"])
    if "arith.truncf : f64 to f32" in traced_ops:  # eps, where the kernel reads it
        traced_ops.remove("arith.truncf : f64 to f32")
    assert traced_ops == _float_ops(eager["ttir"]), f"{case}: other float operations"
    reductions = _reductions(eager["ttgir"])
    assert reductions, f"{case}: no reduction found in the TTGIR (has its format changed?)"
    changed = _reductions(traced["ttgir"]) ^ reductions
    if case in ROWS_ADJACENT_UNDER_INDUCTOR:
        # Only sums over the rows (axis 0: dweight) or over one-element rows.
        changed = {r for r in changed if r[0] != "0" and not re.search(r"<\d+x1xf32", r[2])}
    assert not changed, f"{case}: reductions in other layouts: {sorted(changed)}"


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET="0")
    return subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True,
                          text=True, timeout=600)


def test_every_kernel_taking_eps_is_checked():
    proc = _run("--list")
    assert proc.returncode == 0, proc.stderr[-4000:]
    checked = {f"{module}.{name}" for module, name, *_ in CASES.values()}
    assert set(proc.stdout.split()) == checked


@pytest.mark.parametrize("case", CASES)
def test_compiled_kernel_computes_in_fp32_like_the_eager_one(case):
    proc = _run(case)
    assert proc.returncode == 0, proc.stderr[-4000:]


if __name__ == "__main__":
    if sys.argv[1] == "--list":
        print("\n".join(sorted(_kernels_taking_eps())))
    else:
        check(sys.argv[1])
