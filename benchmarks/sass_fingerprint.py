"""Fingerprint the SASS of every kernel over a matrix of launch configurations (no GPU needed).

A refactor of kernel source that should not change the machine code is checked by running
this on the tree before and after and diffing the outputs: each line names a kernel and its
configuration and gives a hash of its sm_90 SASS (addresses and constant-bank offsets
removed, so added arguments or reordered parameters do not count) and its length. Identical
lines mean identical instructions, registers and schedule, so the GPU timings and bits
measured before still hold.

    git worktree add /tmp/before HEAD
    (cd /tmp/before && PYTHONPATH=$PWD python benchmarks/sass_fingerprint.py) > before.txt
    python benchmarks/sass_fingerprint.py > after.txt && diff before.txt after.txt
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

FORWARD_POINTERS = {name: "*bf16" for name in ("X", "GATE", "W", "Y")} | {"RSTD": "*fp32"}
BACKWARD_POINTERS = ({name: "*bf16" for name in ("X", "GATE", "W", "DY", "DX", "DGATE")}
                     | {"RSTD": "*fp32", "DW_PARTIAL": "*fp32", "ROW_DOTS": "*fp32"})


def fingerprint(lines: list[str]) -> tuple[str, int]:
    body = []
    for line in lines:
        line = re.sub(r"/\*[0-9a-f]+\*/", "", line)  # instruction addresses
        line = re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "C", line)  # kernel-argument offsets
        if line.strip():
            body.append(line.strip())
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


def main() -> None:
    for name, kernel, pointers, constexprs, num_warps in variants():
        if "TAIL_N" in kernel.arg_names:  # trees before the head + tail forward lack it
            constexprs = dict(constexprs, TAIL_N=constexprs.get("TAIL_N", 0))
        lines, _ = disassemble(compile_for_sm90(kernel, pointers, constexprs, num_warps))
        digest, length = fingerprint(lines)
        print(f"{name:60s} {digest} {length}", flush=True)


if __name__ == "__main__":
    main()
