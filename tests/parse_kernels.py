"""Parse every kernel variant to Triton IR the way Inductor's mutation analysis does.

Run as a script (``python tests/parse_kernels.py KERNEL``) by test_kernel_parse.py: it needs
TRITON_INTERPRET unset, and the CPU suite sets it. Inductor (torch.compile of a model calling
gatednorm) re-parses a user kernel to find which arguments it writes, and there an integer
argument equal to 1 becomes a Python constant, ``do_not_specialize`` or not. Kernel code that
calls a tensor method on a runtime integer (``size2.to(...)``) then fails to parse, and
Inductor's fallback breaks the compiled graph; the GPU suite caught one such change. Parsing
needs no GPU. Prints one line per failing variant; exits 1 if any failed.
"""

from __future__ import annotations

import itertools
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402

from gatednorm.kernels import backward, forward  # noqa: E402

NO_PDL = dict(WAIT_FOR_PRIOR_GRID=False)
KERNELS = {
    "forward_tile": (forward.forward_tile_kernel, dict(BLOCK_ROWS=16, BLOCK_N=128, TAIL_N=0,
                                                       STORE_RSTD=True)),
    "forward_row_loop": (forward.forward_row_loop_kernel, dict(BLOCK_ROWS=16, BLOCK_N=128,
                                                               TAIL_N=0, STORE_RSTD=True,
                                                               LOOP_STAGES=2)),
    # A group held as a head and a tail tile (96 = 64 + 32).
    "forward_tile_head_tail": (forward.forward_tile_kernel, dict(
        BLOCK_ROWS=16, BLOCK_N=64, TAIL_N=32, STORE_RSTD=True)),
    "forward_row_loop_head_tail": (forward.forward_row_loop_kernel, dict(
        BLOCK_ROWS=16, BLOCK_N=64, TAIL_N=32, STORE_RSTD=True, LOOP_STAGES=2)),
    "forward_long_row": (forward.forward_long_row_kernel, dict(BLOCK_ROWS=1, BLOCK_N=4096,
                                                               STORE_RSTD=True,
                                                               LOOP_STAGES=2)),
    "backward_tile": (backward.backward_tile_kernel, dict(BLOCK_ROWS=4, BLOCK_N=128, TAIL_N=0,
                                                          LOOP_STAGES=3, SPLIT_PASS=0,
                                                          DOT_BLOCKS=1, **NO_PDL)),
    # A group held as a head and a tail tile (96 = 64 + 32).
    "backward_tile_head_tail": (backward.backward_tile_kernel, dict(
        BLOCK_ROWS=4, BLOCK_N=64, TAIL_N=32, LOOP_STAGES=3, SPLIT_PASS=0, DOT_BLOCKS=1,
        **NO_PDL)),
    # Eager launches on sm_90+: programmatic dependent launch between the backward's launches.
    "backward_tile_pdl": (backward.backward_tile_kernel, dict(
        BLOCK_ROWS=4, BLOCK_N=128, TAIL_N=0, LOOP_STAGES=3, SPLIT_PASS=0, DOT_BLOCKS=1,
        WAIT_FOR_PRIOR_GRID=True)),
    # A group of one element (its own 1 - h_hat^2 path).
    "backward_tile_group_of_one": (backward.backward_tile_kernel, dict(
        BLOCK_ROWS=512, BLOCK_N=1, TAIL_N=0, LOOP_STAGES=3, SPLIT_PASS=0, DOT_BLOCKS=1,
        **NO_PDL)),
    # A group cut into column blocks: the row dot products, then dx and dgate.
    "backward_split_row_dots": (backward.backward_tile_kernel, dict(
        BLOCK_ROWS=1, BLOCK_N=2048, TAIL_N=0, LOOP_STAGES=3, SPLIT_PASS=1, DOT_BLOCKS=16,
        **NO_PDL)),
    "backward_split_input_grads": (backward.backward_tile_kernel, dict(
        BLOCK_ROWS=1, BLOCK_N=2048, TAIL_N=0, LOOP_STAGES=3, SPLIT_PASS=2, DOT_BLOCKS=16,
        **NO_PDL)),
    "backward_split_input_grads_pdl": (backward.backward_tile_kernel, dict(
        BLOCK_ROWS=1, BLOCK_N=2048, TAIL_N=0, LOOP_STAGES=3, SPLIT_PASS=2, DOT_BLOCKS=16,
        WAIT_FOR_PRIOR_GRID=True)),
    "dweight_reduce": (backward.dweight_reduce_kernel, dict(BLOCK_CHUNKS=128, BLOCK_COLS=32,
                                                            **NO_PDL)),
    "dweight_reduce_pdl": (backward.dweight_reduce_kernel, dict(
        BLOCK_CHUNKS=128, BLOCK_COLS=32, WAIT_FOR_PRIOR_GRID=True)),
}
POINTERS = {name: "*bf16" for name in ("X", "GATE", "W", "Y", "DY", "DX", "DGATE")}
POINTERS.update(RSTD="*fp32", DW_PARTIAL="*fp32", ROW_DOTS="*fp32", PARTIAL="*fp32",
                OUT="*fp32")


def parse(kernel, constexprs: dict, unit_ints: bool) -> None:
    """Build the kernel's Triton IR for sm_90; with ``unit_ints`` every integer argument is
    the constant 1, as in Inductor's parse."""
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    options = backend.parse_options({})
    signature, constants = {}, dict(constexprs)
    for name in kernel.arg_names:
        if name in constants:
            signature[name] = "constexpr"
        elif name in POINTERS:
            signature[name] = POINTERS[name]
        elif name == "eps":
            signature[name] = "fp32"
        elif unit_ints:
            signature[name] = "constexpr"
            constants[name] = 1
        else:
            signature[name] = "i32"
    context = triton._C.libtriton.ir.context()
    backend.load_dialects(context)
    ASTSource(kernel, signature, constants).make_ir(
        target, options, backend.get_codegen_implementation(options), backend.get_module_map(),
        context)


# Launch flags of the tile kernels (set by launch.py from the layout and the tile): every
# combination the launcher can pass.
ROW_FLAGS = {
    "forward_tile": [dict(RSTD_BY_PTX=ptx, GATE_ROWS_AS_X=share, Y_ROWS_AS_X=share)
                     for ptx, share in ((False, False), (True, False), (True, True))],
    "backward_tile": [dict(GATE_ROWS_AS_X=share, DY_ROWS_AS_X=share, DX_ROWS_AS_X=share,
                           DGATE_ROWS_AS_X=share) for share in (False, True)],
}
# One-row tiles of a cut group never share row offsets (config.shares_row_offsets).
ROW_FLAGS["backward_split_row_dots"] = ROW_FLAGS["backward_split_input_grads"] = [
    ROW_FLAGS["backward_tile"][0]]
ROW_FLAGS["backward_tile_pdl"] = ROW_FLAGS["backward_tile"]
ROW_FLAGS["backward_split_input_grads_pdl"] = ROW_FLAGS["backward_split_input_grads"]


def variants(kernel_name: str):
    if kernel_name.startswith("dweight_reduce"):
        yield {}
        return
    for leading_dims, norm_before_gate, rounding, has_weight, row_flags in itertools.product(
            (1, 2, 3), (True, False), (0, 1, 2), (True, False),
            ROW_FLAGS.get(kernel_name, [{}])):
        yield dict(LEADING_DIMS=leading_dims, ROW_ALIGN=8, HAS_WEIGHT=has_weight,
                   ZERO_CENTERED=False, ACTIVATION=0, NORM_BEFORE_GATE=norm_before_gate,
                   ROUNDING=rounding, WEIGHT_PRODUCT_ROUNDED=has_weight and rounding == 2,
                   **row_flags)


def main() -> int:
    kernel, sizes = KERNELS[sys.argv[1]]
    failures = 0
    for flags in variants(sys.argv[1]):
        for unit_ints in (False, True):
            try:
                parse(kernel, dict(flags, **sizes), unit_ints)
            except Exception as error:  # report every failing variant, not just the first
                failures += 1
                lines = [line for line in str(error).splitlines() if "Error" in line]
                print(f"{sys.argv[1]} {flags} unit_ints={unit_ints}: "
                      f"{lines[-1].strip() if lines else repr(error)[:300]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
