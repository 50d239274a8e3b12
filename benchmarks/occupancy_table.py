"""Registers, shared memory and resident programs of every backward table tile (no GPU needed).

Each line is one group size and gate order as the eager launcher builds it (table tile,
shared row offsets, programmatic-launch flags, program target), compiled for sm_90 in bf16
with `te` rounding and a weight: the registers and shared memory ptxas gives it, how many of
its programs fit one SM (H100 / H200: 64K registers, 227 KB of shared memory a block may use,
64 warps), and how many waves of 132 SMs its program target makes. A kernel edit can move a
tile's register count and so its occupancy, and the backward's speed with it by 10 % or more
(docs/perf-notes.md, variant 36): diff this table before and after. The CPU suite
(tests/test_occupancy_record.py) compares it with the committed record,
benchmarks/results/cpu-2026-12-03-backward-occupancy.txt (when a change is deliberate and its
tiles' program counts were measured again, regenerate it, keeping the header line).

    python benchmarks/occupancy_table.py > after.txt
"""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from instruction_count import compile_for_sm90, disassemble  # noqa: E402

from gatednorm.kernels import backward, config, plan  # noqa: E402
from gatednorm.kernels.layout import VECTOR_ALIGN  # noqa: E402

GROUP_SIZES = (64, 96, 128, 192, 256, 512, 640, 1024, 2048, 4096, 8192, 20000)
POINTERS = ({name: "*bf16" for name in ("X", "GATE", "W", "DY", "DX", "DGATE")}
            | {"RSTD": "*fp32", "DW_PARTIAL": "*fp32", "ROW_DOTS": "*fp32"})
SMS = 132
REGISTERS_PER_SM = 65536
SHARED_BYTES_PER_SM = 233472  # 228 KB, of which the runtime keeps 1 KB per block
MAX_WARPS_PER_SM = 64
MAX_BLOCKS_PER_SM = 32


def programs_per_sm(registers: int, shared_bytes: int, num_warps: int) -> int:
    # Registers are allocated per warp in units of 256 (8 per thread).
    per_warp = -(-registers // 8) * 8 * 32
    by_registers = (REGISTERS_PER_SM // per_warp) // num_warps
    by_shared = SHARED_BYTES_PER_SM // (shared_bytes + 1024)
    return min(by_registers, by_shared, MAX_WARPS_PER_SM // num_warps, MAX_BLOCKS_PER_SM)


def launches(group_size: int, norm_before_gate: bool):
    """(pass name, constexprs, num_warps, target programs) of the backward's tile launches."""
    tile = config.backward_config(group_size)
    share = plan.shares_row_offsets(tile, 1)
    # Contiguous 16-bit rows: 16-byte vectors unless the table entry caps them.
    row_align = min(VECTOR_ALIGN, tile.max_vector_elements or VECTOR_ALIGN)
    flags = dict(LEADING_DIMS=1, ROW_ALIGN=row_align, HAS_WEIGHT=True, ZERO_CENTERED=False,
                 ACTIVATION=0, NORM_BEFORE_GATE=norm_before_gate, ROUNDING=0,
                 WEIGHT_PRODUCT_ROUNDED=False, BLOCK_ROWS=tile.block_rows,
                 BLOCK_N=tile.block_n, TAIL_N=tile.tail_n, LOOP_STAGES=tile.loop_stages,
                 GATE_ROWS_AS_X=share, DY_ROWS_AS_X=share, DX_ROWS_AS_X=share,
                 DGATE_ROWS_AS_X=share)
    target = plan.backward_target_programs(tile)
    if not tile.long_row:
        yield "tile", dict(flags, SPLIT_PASS=0, DOT_BLOCKS=1, WAIT_FOR_PRIOR_GRID=False), \
            tile.num_warps, target
        return
    dot_blocks = 16
    yield "row dots", dict(flags, SPLIT_PASS=1, DOT_BLOCKS=dot_blocks,
                           WAIT_FOR_PRIOR_GRID=False), tile.num_warps, target
    yield "input grads", dict(flags, SPLIT_PASS=2, DOT_BLOCKS=dot_blocks,
                              WAIT_FOR_PRIOR_GRID=True), tile.num_warps, target


def main() -> None:
    print(f"{'group':>6} {'order':10} {'pass':11} {'tile':>9} {'warps':>5} {'stages':>6} "
          f"{'regs':>4} {'smem':>6} {'per SM':>6} {'target':>6} {'waves':>5}")
    for group_size in GROUP_SIZES:
        for norm_before_gate in (True, False):
            for name, constexprs, num_warps, target in launches(group_size, norm_before_gate):
                compiled = compile_for_sm90(backward.backward_tile_kernel, POINTERS,
                                            constexprs, num_warps)
                # The loaded kernel's n_regs needs a GPU; cuobjdump reads it from the cubin.
                usage = disassemble(compiled)[1]
                registers = int(usage.split("REG:")[1].split()[0])
                shared = compiled.metadata.shared
                fit = programs_per_sm(registers, shared, num_warps)
                tile = f"{constexprs['BLOCK_ROWS']}x{constexprs['BLOCK_N']}" + (
                    f"+{constexprs['TAIL_N']}" if constexprs["TAIL_N"] else "")
                order = "norm first" if norm_before_gate else "gate first"
                print(f"{group_size:>6} {order:10} {name:11} {tile:>9} {num_warps:>5} "
                      f"{constexprs['LOOP_STAGES']:>6} {registers:>4} {shared:>6} {fit:>6} "
                      f"{target:>6} {target / (SMS * fit):>5.2f}", flush=True)


if __name__ == "__main__":
    main()
