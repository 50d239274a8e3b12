"""Finished launch plans: a table entry (gatednorm.kernels.config) applied to one call's shape,
dtypes and device, with the rules that adjust it (decode sizes, shared memory, fp32 inputs).

The plan depends only on the group size, the row count, the dtypes and the device's shared
memory; the row count may be a torch.compile SymInt (only the decode rule needs it concrete).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton

from gatednorm.kernels import config
from gatednorm.kernels.config import LaunchConfig, backward_chunking, chunking

# Kernels a plan names (the launcher maps them to the jit functions).
FORWARD_TILE, FORWARD_ROW_LOOP, FORWARD_LONG_ROW = "forward_tile", "forward_row_loop", \
    "forward_long_row"
BACKWARD_TILE = "backward_tile"


@dataclass(frozen=True)
class ForwardPlan:
    """kernel: FORWARD_TILE (one tile a program), FORWARD_ROW_LOOP (resident programs over
    chunks of rows_per_chunk rows) or FORWARD_LONG_ROW (one row a program, looping over
    columns). store: the tile kernel's rstd store and row-offset choice."""

    kernel: str
    tile: LaunchConfig
    programs: object  # int, or a SymInt under torch.compile
    rows_per_chunk: object | None
    store: config.StoreChoice


@dataclass(frozen=True)
class BackwardPlan:
    """column_blocks: programs per chunk of rows (num_groups, times the column blocks a group
    is cut into when wider than the tile: two launches, the first writing row dot products);
    dot_blocks: the column blocks of a cut group rounded up to a power of two (1 uncut);
    shares_rows: tensors laid out like x use x's row offsets."""

    tile: LaunchConfig
    column_blocks: int
    rows_per_chunk: object
    num_chunks: object
    dot_blocks: int
    shares_rows: bool

    @property
    def programs(self):
        return self.num_chunks * self.column_blocks


def few_rows_forward_config(tile: LaunchConfig, rows: int, num_groups: int) -> LaunchConfig:
    """``tile``, or the one-warp decode tile when ``tile`` would start fewer than
    FORWARD_FEW_PROGRAMS programs (tiles up to 128 wide, where it was measured; not a head +
    tail tile, whose reduction order depends on the tile's rows and warps)."""
    if (tile.long_row or tile.block_n > 128 or tile.tail_n
            or triton.cdiv(rows, tile.block_rows) * num_groups >= config.FORWARD_FEW_PROGRAMS):
        return tile
    return LaunchConfig(block_rows=max(1, config.FEW_ROWS_TILE_ELEMENTS // tile.block_n),
                        block_n=tile.block_n, num_warps=1, long_row=False)


def fit_shared_memory(tile: LaunchConfig, loaded_bytes_per_element: int,
                      shared_memory_bytes: int) -> LaunchConfig:
    """``tile``, or the same without prefetching when its (loop_stages - 1) tiles of prefetch
    buffers (``loaded_bytes_per_element`` summed over the loaded tensors) would not fit the
    device's shared memory (fp32 inputs double them; prefetching changes no result)."""
    prefetch_bytes = ((tile.loop_stages - 1) * tile.block_rows * (tile.block_n + tile.tail_n)
                      * loaded_bytes_per_element)
    if (tile.loop_stages > 1
            and prefetch_bytes + config.SHARED_MEMORY_RESERVE > shared_memory_bytes):
        return replace(tile, loop_stages=1)
    return tile


def backward_target_programs(tile: LaunchConfig) -> int:
    """About how many (chunk, group) programs the backward of ``tile`` starts."""
    return tile.target_programs or config.BACKWARD_TARGET_PROGRAMS


def shares_row_offsets(tile: LaunchConfig, leading_dims: int) -> bool:
    """Whether the backward addresses tensors laid out like x with x's row offsets."""
    return (tile.shares_rows and not tile.long_row and tile.block_rows > 1
            and leading_dims == 1)


def plan_forward(group_size: int, rows, num_groups: int, *, x_dtype: torch.dtype,
                 gate_dtype: torch.dtype, activation: str, leading_dims: int, store_rstd: bool,
                 traceable: bool, shared_memory_bytes: int) -> ForwardPlan:
    """The forward's launch for ``rows`` rows of ``num_groups`` groups of ``group_size``."""
    tile = config.forward_config(group_size)
    if isinstance(rows, int):
        tile = few_rows_forward_config(tile, rows, num_groups)
    widest = max(x_dtype.itemsize, gate_dtype.itemsize)
    if not tile.long_row and widest > 2:
        # With fp32 inputs the row loop's pipelined loads changed the sum of squares' register
        # layout, and so rstd's last bit, between the training and inference kernels.
        tile = replace(tile, loop_stages=1)
    elif not tile.long_row:
        tile = fit_shared_memory(tile, x_dtype.itemsize + gate_dtype.itemsize,
                                 shared_memory_bytes)
    store = config.NO_STORE_CHOICE
    rows_per_chunk = None
    if tile.long_row:
        kernel, programs = FORWARD_LONG_ROW, rows * num_groups
    elif tile.loop_stages > 1:
        kernel = FORWARD_ROW_LOOP
        rows_per_chunk, num_chunks = chunking(
            rows, num_groups, tile.block_rows,
            tile.target_programs or config.FORWARD_TARGET_PROGRAMS)
        programs = num_chunks * num_groups
    else:
        kernel = FORWARD_TILE
        programs = triton.cdiv(rows, tile.block_rows) * num_groups
        if store_rstd and not traceable and not tile.tail_n:
            store = config.FORWARD_TILE_STORE.get(
                (tile.block_n, x_dtype, activation, leading_dims > 1), config.NO_STORE_CHOICE)
    return ForwardPlan(kernel=kernel, tile=tile, programs=programs,
                       rows_per_chunk=rows_per_chunk, store=store)


def plan_backward(group_size: int, rows, num_groups: int, *, loaded_bytes_per_element: int,
                  leading_dims: int, shared_memory_bytes: int) -> BackwardPlan:
    """The backward's launch (``loaded_bytes_per_element``: x, gate and dy's element sizes
    summed, what its loop prefetches)."""
    tile = fit_shared_memory(config.backward_config(group_size), loaded_bytes_per_element,
                             shared_memory_bytes)
    blocks_per_group = triton.cdiv(group_size, tile.block_n) if tile.long_row else 1
    column_blocks = num_groups * blocks_per_group
    rows_per_chunk, num_chunks = backward_chunking(rows, column_blocks, tile.block_rows,
                                                   backward_target_programs(tile))
    shares_rows = shares_row_offsets(tile, leading_dims)
    return BackwardPlan(tile=tile, column_blocks=column_blocks, rows_per_chunk=rows_per_chunk,
                        num_chunks=num_chunks,
                        dot_blocks=triton.next_power_of_2(blocks_per_group),
                        shares_rows=shares_rows)
