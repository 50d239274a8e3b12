"""Fingerprint the SASS of every kernel over a matrix of launch configurations (no GPU needed).

A refactor of kernel source that should not change the machine code is checked by running
this on the tree before and after and diffing the outputs: each line names a kernel and its
configuration and gives a hash of its sm_90 SASS (addresses and constant-bank offsets
removed, so added arguments or reordered parameters do not count) and its length. Identical
lines mean identical instructions, registers and schedule, so the GPU timings and bits
measured before still hold.

    git worktree add /tmp/before HEAD
    PYTHONPATH=/tmp/before python benchmarks/sass_fingerprint.py > before.txt
    python benchmarks/sass_fingerprint.py > after.txt && diff before.txt after.txt

Both runs use this script (the older tree's kernels through PYTHONPATH), so both lists name
the same configurations. The FP8-output kernels are covered too: the fused rowwise tile for
every scale kind, order, rounding and store path, its head + tail and two-heads tiles, the
columnwise tile, and the unfused path's quantize kernels. About three minutes on two cores.

Where lines differ, ``--order-free`` hashes each kernel's instructions as a multiset instead
(registers, predicates and reuse flags left out): lines equal there mean the same
instructions in another schedule or register allocation, so the same arithmetic and bits;
only the timing may have moved.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import sys

os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from instruction_count import compile_for_sm90, disassemble  # noqa: E402

from gatednorm.kernels import backward, forward  # noqa: E402
from gatednorm.kernels import launch as kernel_launch  # noqa: E402
from gatednorm.quantize import columnwise, launch  # noqa: E402
from gatednorm.quantize import kernels as quantized  # noqa: E402

FORWARD_POINTERS = {name: "*bf16" for name in ("X", "GATE", "W", "Y")} | {"RSTD": "*fp32"}
BACKWARD_POINTERS = ({name: "*bf16" for name in ("X", "GATE", "W", "DY", "DX", "DGATE")}
                     | {"RSTD": "*fp32", "DW_PARTIAL": "*fp32", "ROW_DOTS": "*fp32"})


def fingerprint(lines: list[str], order_free: bool = False) -> tuple[str, int]:
    """(hash, length) of the SASS. ``order_free``: of its instructions as a multiset, with
    registers, predicates, labels and operand-reuse flags left out, so that two kernels that
    differ only in schedule and register allocation hash alike."""
    body = []
    for line in lines:
        line = re.sub(r"/\*[0-9a-f]+\*/", "", line).strip()  # instruction addresses
        line = re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "C", line)  # kernel-argument offsets
        if not line:
            continue
        if order_free:
            if line.endswith(":"):  # a label
                continue
            line = re.sub(r"\bU?R\d+\b", "R", line)
            line = re.sub(r"\bU?P\d\b", "P", line)
            line = re.sub(r"\.L_x_\d+", "L", line).replace(".reuse", "")
            line = re.sub(r"(P2R|R2P) (\S+), PR, (\S+), 0x[0-9a-f]+", r"\1 \2, PR, \3, M", line)
        body.append(line)
    if order_free:
        body.sort()
    return hashlib.sha1("\n".join(body).encode()).hexdigest()[:12], len(body)


# The eager launches of sm_90+ add programmatic-launch instructions; the rest compiles as before.
NO_PDL = dict(WAIT_FOR_PRIOR_GRID=False)


def variants():
    """(name, kernel, pointer types, constexprs, num_warps) for each configuration."""
    for leading_dims, norm_before_gate, rounding in itertools.product((1, 2), (True, False),
                                                                      (0, 2)):
        flags = dict(LEADING_DIMS=leading_dims, ROW_ALIGN=8, HAS_WEIGHT=True,
                     ZERO_CENTERED=False, ACTIVATION=0, NORM_BEFORE_GATE=norm_before_gate,
                     ROUNDING=rounding, WEIGHT_PRODUCT_ROUNDED=rounding == 2)
        tag = f"ld{leading_dims} {'norm_first' if norm_before_gate else 'gate_first'} r{rounding}"
        for store in (True, False):
            shared = dict(GATE_ROWS_AS_X=leading_dims == 1, Y_ROWS_AS_X=True)
            own = dict(GATE_ROWS_AS_X=False, Y_ROWS_AS_X=False)
            fwd = dict(flags, STORE_RSTD=store)
            yield (f"forward_tile ptx-shared {tag} rstd={store}", forward.forward_tile_kernel,
                   FORWARD_POINTERS, dict(fwd, BLOCK_ROWS=16, BLOCK_N=128, RSTD_BY_PTX=store,
                                          **shared), 4)
            yield (f"forward_tile own {tag} rstd={store}", forward.forward_tile_kernel,
                   FORWARD_POINTERS, dict(fwd, BLOCK_ROWS=16, BLOCK_N=128, RSTD_BY_PTX=False,
                                          **own), 4)
            yield (f"forward_row_loop {tag} rstd={store}", forward.forward_row_loop_kernel,
                   FORWARD_POINTERS, dict(fwd, BLOCK_ROWS=8, BLOCK_N=256, LOOP_STAGES=3), 4)
            yield (f"forward_long_row {tag} rstd={store}", forward.forward_long_row_kernel,
                   FORWARD_POINTERS, dict(fwd, BLOCK_ROWS=1, BLOCK_N=4096, LOOP_STAGES=1), 16)
        for share in (True, False):
            rows_as_x = dict(GATE_ROWS_AS_X=share and leading_dims == 1, DY_ROWS_AS_X=share,
                             DX_ROWS_AS_X=share, DGATE_ROWS_AS_X=share)
            yield (f"backward_tile shared={share} {tag}", backward.backward_tile_kernel,
                   BACKWARD_POINTERS, dict(flags, BLOCK_ROWS=4, BLOCK_N=128, LOOP_STAGES=3,
                                           SPLIT_PASS=0, DOT_BLOCKS=1, **rows_as_x, **NO_PDL), 1)
        for split_pass in (1, 2):
            yield (f"backward_split pass={split_pass} {tag}", backward.backward_tile_kernel,
                   BACKWARD_POINTERS, dict(flags, BLOCK_ROWS=1, BLOCK_N=2048, LOOP_STAGES=3,
                                           SPLIT_PASS=split_pass, DOT_BLOCKS=16,
                                           GATE_ROWS_AS_X=False, DY_ROWS_AS_X=False,
                                           DX_ROWS_AS_X=False, DGATE_ROWS_AS_X=False,
                                           **NO_PDL), 4)

    yield ("dweight_reduce", backward.dweight_reduce_kernel, {"PARTIAL": "*fp32", "OUT": "*fp32"},
           dict(BLOCK_CHUNKS=kernel_launch.DWEIGHT_BLOCK_CHUNKS,
                BLOCK_COLS=kernel_launch.DWEIGHT_BLOCK_COLS, **NO_PDL), 4)


# FP8 output: scale kinds 0 1x128 fp32, 1 1x128 power of two, 2 MXFP8, 3 per-tensor given,
# 4 per-tensor current (launch.scale_kind).
QUANT_KINDS = (0, 1, 2, 3, 4)


def quantized_pointers(kind: int, transposed: bool) -> dict:
    """Pointer types of the FP8 kernels: MXFP8 scales as int32 words (SCALE_WORDS)."""
    scale = "*i32" if kind == 2 else "*fp32"
    pointers = {name: "*bf16" for name in ("X", "GATE", "W", "Y")}
    pointers.update(Q="*u8", SCALE=scale, RSTD="*fp32", TENSOR_SCALE="*fp32", AMAX="*fp32")
    if transposed:
        pointers.update(QT="*u8", SCALE_T=scale)
    return pointers


def rowwise_cap(kind: int) -> int | None:
    """The launcher's register cap of the fused rowwise [16, 128] tile (None in trees
    without one)."""
    if not hasattr(launch, "rowwise_launch"):
        return None
    tiling = launch.Tiling(16, 128, 0, 1, 4, 0)
    return launch.rowwise_launch(tiling, kind).get("maxnreg")


def quantized_variants():
    """(name, kernel, pointer types, constexprs, num_warps, maxnreg) of the FP8-output kernels:
    the fused rowwise tile over the scale kinds, orders, roundings and store paths (GDN's
    [16, 128] tile, Mamba2's 512 + 128 head and tail, two D = 64 heads a 1x128 block), the
    fused columnwise tile, and the unfused path's quantize kernels."""
    for kind, norm_before_gate, rounding, by_ptx in itertools.product(
            QUANT_KINDS, (True, False), (0, 2), (True, False)):
        mxfp8 = kind == 2
        flags = dict(LEADING_DIMS=1, ROW_ALIGN=8, HAS_WEIGHT=True, ZERO_CENTERED=False,
                     ACTIVATION=0, NORM_BEFORE_GATE=norm_before_gate, ROUNDING=rounding,
                     WEIGHT_PRODUCT_ROUNDED=rounding == 2, QUANT_BLOCK=32 if mxfp8 else 128,
                     SCALE_KIND=kind, SWIZZLED=False, SCALE_WORDS=mxfp8, ROUND_Y=True,
                     STORES_BY_PTX=by_ptx)
        tag = (f"kind{kind} {'norm_first' if norm_before_gate else 'gate_first'} r{rounding} "
               f"{'ptx' if by_ptx else 'tl.store'}")
        rowwise = dict(flags, AMAX_ONLY=False, GROUPS_PER_TILE=1, TAIL_N=0)
        pointers = quantized_pointers(kind, False)
        for store_rstd in (True, False):
            yield (f"quantized_tile {tag} rstd={store_rstd}", quantized.quantized_forward_kernel,
                   pointers, dict(rowwise, BLOCK_ROWS=16, BLOCK_N=128, STORE_RSTD=store_rstd),
                   4, rowwise_cap(kind))
        if not by_ptx or rounding:
            continue
        yield (f"quantized_head_tail {tag}", quantized.quantized_forward_kernel, pointers,
               dict(rowwise, BLOCK_ROWS=1, BLOCK_N=512, TAIL_N=128, STORE_RSTD=True), 1, None)
        if kind == 4:
            yield (f"quantized_amax_pass {tag}", quantized.quantized_forward_kernel, pointers,
                   dict(rowwise, BLOCK_ROWS=16, BLOCK_N=128, STORE_RSTD=False, AMAX_ONLY=True),
                   4, None)
        if kind in (0, 1):
            yield (f"quantized_two_heads {tag}", quantized.quantized_forward_kernel, pointers,
                   dict(rowwise, BLOCK_ROWS=16, BLOCK_N=64, GROUPS_PER_TILE=2,
                        STORE_RSTD=True), 4, None)
        if norm_before_gate:  # the unfused path's kernels take y: one variant for both orders
            yield (f"quantize kind{kind}", quantized.quantize_kernel, pointers,
                   dict(BLOCK_ROWS=launch.QUANTIZE_TILE_ROWS, WIDTH=launch.QUANTIZE_TILE_COLUMNS,
                        QUANT_BLOCK=flags["QUANT_BLOCK"], SCALE_KIND=kind, SWIZZLED=False,
                        SCALE_WORDS=mxfp8, AMAX_ONLY=False, STORES_BY_PTX=True),
                   launch.QUANTIZE_TILE_WARPS, None)
        if kind not in (0, 1, 2):  # per-tensor formats have no columnwise copy
            continue
        cap = launch.columnwise_launch(flags["QUANT_BLOCK"], 128)
        yield (f"quantized_columnwise {tag}", columnwise.quantized_forward_columnwise_kernel,
               quantized_pointers(kind, True),
               dict(flags, BLOCK_N=128, TAIL_N=0, GROUPS_PER_TILE=1, STORE_RSTD=True,
                    QT_ALIGN=16), cap["num_warps"], cap.get("maxnreg"))
        if norm_before_gate:
            yield (f"quantize_columnwise kind{kind}", columnwise.quantize_columnwise_kernel,
                   quantized_pointers(kind, True),
                   dict(WIDTH=128, QUANT_BLOCK=flags["QUANT_BLOCK"], SCALE_KIND=kind,
                        SWIZZLED=False, SCALE_WORDS=mxfp8, QT_ALIGN=16, STORES_BY_PTX=True),
                   cap["num_warps"], cap.get("maxnreg"))


def configurations():
    """(name, kernel, pointer types, constexprs, num_warps, maxnreg) of every fingerprinted
    configuration."""
    for variant in [(*variant, None) for variant in variants()] + list(quantized_variants()):
        name, kernel, pointers, constexprs, num_warps, maxnreg = variant
        if "TAIL_N" in kernel.arg_names:  # trees before the head + tail forward lack it
            constexprs = dict(constexprs, TAIL_N=constexprs.get("TAIL_N", 0))
        yield name, kernel, pointers, constexprs, num_warps, maxnreg


def main() -> None:
    order_free = "--order-free" in sys.argv[1:]
    for name, kernel, pointers, constexprs, num_warps, maxnreg in configurations():
        lines, _ = disassemble(compile_for_sm90(kernel, pointers, constexprs, num_warps,
                                                maxnreg))
        digest, length = fingerprint(lines, order_free)
        print(f"{name:60s} {digest} {length}", flush=True)


if __name__ == "__main__":
    main()
