"""Launch configurations: a small table keyed by group size and dtype, no autotuning.

Autotuning on the hot path is slow on the first call and can pick differently from run to run,
which would also change dweight's bits (the chunking depends on the tile). The numbers here
were chosen on an H200 (docs/perf-notes.md has the measurements behind them).
"""

from __future__ import annotations

from dataclasses import dataclass

import triton

# Groups up to this many elements are held in registers as one tile; longer ones loop.
MAX_TILE_N = 16384
# Chunk width of the looped (long-row) kernels.
LONG_ROW_BLOCK_N = 4096
# The backward splits rows into about this many (chunk, group) programs. A constant, not the
# SM count: the partition, and so dweight's rounding, must not depend on the GPU.
BACKWARD_TARGET_PROGRAMS = 1024


@dataclass(frozen=True)
class LaunchConfig:
    """How one kernel launch tiles the rows of one group size."""

    block_rows: int
    block_n: int
    num_warps: int
    long_row: bool


def _warps_for(tile_elements: int) -> int:
    if tile_elements <= 1024:
        return 4
    if tile_elements <= 8192:
        return 8
    return 16


def forward_config(group_size: int, element_bytes: int) -> LaunchConfig:
    """Tile of about 8 KB of x per program: enough bytes in flight per SM, no spills."""
    block_n = triton.next_power_of_2(group_size)
    if block_n > MAX_TILE_N:
        return LaunchConfig(1, LONG_ROW_BLOCK_N, 8, True)
    block_rows = max(1, 8192 // (block_n * element_bytes))
    return LaunchConfig(block_rows, block_n, _warps_for(block_rows * block_n), False)


def backward_config(group_size: int, element_bytes: int) -> LaunchConfig:
    """Half the forward tile: the backward keeps three inputs and more temporaries live."""
    block_n = triton.next_power_of_2(group_size)
    if block_n > MAX_TILE_N:
        return LaunchConfig(1, LONG_ROW_BLOCK_N, 8, True)
    block_rows = max(1, 4096 // (block_n * element_bytes))
    return LaunchConfig(block_rows, block_n, _warps_for(block_rows * block_n), False)


def backward_chunking(rows: int, num_groups: int, block_rows: int) -> tuple[int, int]:
    """(rows_per_chunk, num_chunks): a multiple of block_rows, fixed by the shape alone."""
    chunks_wanted = max(1, BACKWARD_TARGET_PROGRAMS // num_groups)
    rows_per_chunk = triton.cdiv(rows, chunks_wanted)
    rows_per_chunk = triton.cdiv(rows_per_chunk, block_rows) * block_rows
    return rows_per_chunk, triton.cdiv(rows, rows_per_chunk)
