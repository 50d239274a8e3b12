"""The quantized kernels compile for the H100/H200 (sm_90) without a GPU.

The interpreter runs the kernels as Python, so it misses what only the compiler rejects
(non-constexpr globals, unsupported control flow, type errors in the lowering). This test
compiles each kernel variant to a cubin for sm_90 with Triton's own ptxas, in a subprocess
with TRITON_INTERPRET=0 (the flag is read at import).
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

# Each case: kernel name, then the constexprs that differ from BASE.
BASE = dict(LEADING_DIMS=1, ROW_ALIGN=8, BLOCK_ROWS=16, BLOCK_N=128, TAIL_N=0,
            GROUPS_PER_TILE=1, HAS_WEIGHT=True, ZERO_CENTERED=False, ACTIVATION=0,
            NORM_BEFORE_GATE=True, ROUNDING=0, WEIGHT_PRODUCT_ROUNDED=True, QUANT_BLOCK=128,
            SCALE_KIND=0, SWIZZLED=False, SCALE_WORDS=False, ROUND_Y=True, STORE_RSTD=True,
            STORES_BY_PTX=True)
FUSED_CASES = [
    dict(AMAX_ONLY=False),
    dict(AMAX_ONLY=False, STORES_BY_PTX=False),
    dict(AMAX_ONLY=False, SCALE_KIND=1, SWIZZLED=True),
    dict(AMAX_ONLY=False, SCALE_KIND=2, QUANT_BLOCK=32, SWIZZLED=True),
    dict(AMAX_ONLY=False, SCALE_KIND=2, QUANT_BLOCK=32, BLOCK_N=32, BLOCK_ROWS=32),
    dict(AMAX_ONLY=False, SCALE_KIND=2, QUANT_BLOCK=32, SWIZZLED=True, SCALE_WORDS=True),
    dict(AMAX_ONLY=False, SCALE_KIND=2, QUANT_BLOCK=32, SWIZZLED=True, SCALE_WORDS=True,
         STORES_BY_PTX=False),
    dict(AMAX_ONLY=False, SCALE_KIND=2, QUANT_BLOCK=32, SCALE_WORDS=True, BLOCK_ROWS=1,
         BLOCK_N=512, TAIL_N=128, NORM_BEFORE_GATE=False),
    dict(AMAX_ONLY=True, SCALE_KIND=4, QUANT_BLOCK=1),
    dict(AMAX_ONLY=False, SCALE_KIND=4, QUANT_BLOCK=1),
    dict(AMAX_ONLY=False, SCALE_KIND=3, QUANT_BLOCK=1),
    dict(AMAX_ONLY=False, SCALE_KIND=1, BLOCK_N=64, GROUPS_PER_TILE=2),
    dict(AMAX_ONLY=False, BLOCK_ROWS=1, BLOCK_N=512, TAIL_N=128, NORM_BEFORE_GATE=False,
         ROUNDING=2),
]
# The columnwise kernel's rows are its token block (QUANT_BLOCK): no BLOCK_ROWS.
COLUMNWISE_CASES = [dict(QT_ALIGN=16), dict(QT_ALIGN=1, BLOCK_N=64, GROUPS_PER_TILE=2),
                    dict(QT_ALIGN=1, SCALE_KIND=2, QUANT_BLOCK=32),
                    dict(QT_ALIGN=16, SCALE_KIND=2, QUANT_BLOCK=32, SCALE_WORDS=True)]
QUANTIZE_CASES = [dict(BLOCK_ROWS=16, WIDTH=128, QUANT_BLOCK=128, SCALE_KIND=kind,
                       SWIZZLED=False, SCALE_WORDS=False, AMAX_ONLY=False, STORES_BY_PTX=True)
                  for kind in range(5)]
QUANTIZE_CASES.append(dict(QUANTIZE_CASES[2], QUANT_BLOCK=32, SCALE_WORDS=True))
# The unfused path's kernel of both copies (1x128 fp32 and power-of-two scales, MXFP8).
QUANTIZE_COLUMNWISE_CASES = [dict(WIDTH=128, QUANT_BLOCK=128, SCALE_KIND=0, SWIZZLED=False,
                                  SCALE_WORDS=False, QT_ALIGN=16, STORES_BY_PTX=True),
                             dict(WIDTH=128, QUANT_BLOCK=128, SCALE_KIND=1, SWIZZLED=False,
                                  SCALE_WORDS=False, QT_ALIGN=1, STORES_BY_PTX=False),
                             dict(WIDTH=128, QUANT_BLOCK=32, SCALE_KIND=2, SWIZZLED=True,
                                  SCALE_WORDS=False, QT_ALIGN=16, STORES_BY_PTX=True),
                             dict(WIDTH=128, QUANT_BLOCK=32, SCALE_KIND=2, SWIZZLED=True,
                                  SCALE_WORDS=True, QT_ALIGN=16, STORES_BY_PTX=True)]
POINTERS = dict(X="*bf16", GATE="*bf16", W="*bf16", Y="*bf16", Q="*u8", SCALE="*fp32",
                RSTD="*fp32", TENSOR_SCALE="*fp32", AMAX="*fp32", QT="*u8", SCALE_T="*fp32")


def compile_all() -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from gatednorm.quantize.columnwise import (
        quantize_columnwise_kernel,
        quantized_forward_columnwise_kernel,
    )
    from gatednorm.quantize.kernels import quantize_kernel, quantized_forward_kernel
    from gatednorm.quantize.launch import Tiling, columnwise_launch, rowwise_launch

    target = GPUTarget("cuda", 90, 32)
    cases = ([(quantized_forward_kernel, dict(BASE, **c)) for c in FUSED_CASES]
             + [(quantized_forward_columnwise_kernel,
                 {**{k: v for k, v in BASE.items() if k != "BLOCK_ROWS"}, **c})
                for c in COLUMNWISE_CASES]
             + [(quantize_kernel, c) for c in QUANTIZE_CASES]
             + [(quantize_columnwise_kernel, c) for c in QUANTIZE_COLUMNWISE_CASES])
    for kernel, constexprs in cases:
        signature = {name: ("constexpr" if name in constexprs else POINTERS.get(name)
                            or ("fp32" if name == "eps" else "i64"))
                     for name in kernel.arg_names}
        # The launch (warps and register cap) as the launcher plans it.
        if "QT_ALIGN" in constexprs:
            options = columnwise_launch(constexprs["QUANT_BLOCK"], 128)
        elif "BLOCK_N" in constexprs:
            tiling = Tiling(constexprs["BLOCK_ROWS"], constexprs["BLOCK_N"], constexprs["TAIL_N"],
                            constexprs["GROUPS_PER_TILE"], 4, 0)
            options = dict(num_warps=4, **rowwise_launch(tiling, constexprs["SCALE_KIND"]))
        else:
            options = dict(num_warps=4)
        compiled = triton.compile(ASTSource(kernel, signature, constexprs=constexprs),
                                  target=target, options=options)
        assert compiled.asm["cubin"], kernel.__name__


def test_every_kernel_variant_compiles_for_sm90():
    env = dict(os.environ, TRITON_INTERPRET="0")
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.mark.parametrize("scale_kind", [0, 1, 2])
def test_gdn_tile_issues_every_load_before_its_first_reduction(scale_kind):
    # The launcher's register caps (launch.ROWWISE_TILE_MAXNREG) exist for this schedule: a
    # load issued after the first row reduction adds a memory round trip to every program.
    tool = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "instruction_count.py"
    proc = subprocess.run([sys.executable, str(tool), "--pass", "quantized", "--scale-kind",
                           str(scale_kind)], env=dict(os.environ, TRITON_INTERPRET="0"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    early, total = map(int, re.search(r"before the first shuffle: (\d+) of (\d+)",
                                      proc.stdout).groups())
    assert early == total >= 5, proc.stdout


if __name__ == "__main__":
    compile_all()
