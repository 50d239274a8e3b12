"""Forward kernels: y = norm(x) * act(gate) or norm(x * act(gate)), per group of N elements.

Rows are the flattened leading dims of x (up to three collapsed dims with arbitrary strides);
each row holds ``num_groups`` groups of ``group_size`` contiguous elements, normalized apart.
RSTD (fp32, one per row and group) is stored only for a backward (STORE_RSTD).
Program ``pid`` owns group ``pid % num_groups`` of rows ``[pid // num_groups * BLOCK_ROWS, +BLOCK_ROWS)``.

A group that is not a power of two may be held as two power-of-two tiles side by side, a head
of BLOCK_N columns and a tail of TAIL_N (640 = 512 + 128, 96 = 64 + 32), instead of one tile
padded to the next power of two (TAIL_N = 0): no lane then holds padding.
"""

import triton
import triton.language as tl

from gatednorm.kernels.pointwise import (
    activation_and_slope,
    forward_output,
    fp32_argument,
    gated_input,
    load_gamma,
    row_offsets,
    row_offsets_or,
    store_row_values,
)

# Runtime integers that change with the batch, the sequence length or the layout: never
# specialized, so a new shape reuses the compiled kernel. The group size is left to Triton's
# default specialization (divisible by 16 or not): it is fixed per layer, and knowing it is a
# multiple of 16 is what lets the column mask, and so the loads, be vectorized.
RUNTIME_INTS = [
    "rows", "size1", "size2",
    "stride_x0", "stride_x1", "stride_x2",
    "stride_gate0", "stride_gate1", "stride_gate2",
    "stride_y0", "stride_y1", "stride_y2",
    "num_groups",
]


@triton.jit
def gated_tile(x, g, X_DTYPE: tl.constexpr, ACTIVATION: tl.constexpr,
               NORM_BEFORE_GATE: tl.constexpr, ROUNDING: tl.constexpr):
    """(act, h) of a tile: act(gate), and the tensor the statistics are taken over."""
    act, _ = activation_and_slope(g, ACTIVATION)
    h = gated_input(x, act, X_DTYPE, NORM_BEFORE_GATE, ROUNDING)
    return act, h


@triton.jit
def load_tail(X, GATE, W, x_rows, g_rows, row_mask, group_offset, group_size,
              BLOCK_N: tl.constexpr, TAIL_N: tl.constexpr, HAS_WEIGHT: tl.constexpr,
              ZERO_CENTERED: tl.constexpr, ACTIVATION: tl.constexpr,
              NORM_BEFORE_GATE: tl.constexpr, ROUNDING: tl.constexpr):
    """(cols, mask, act, h, gamma) of a tile's tail: columns [BLOCK_N, BLOCK_N + TAIL_N) of
    its rows' groups."""
    cols = BLOCK_N + tl.arange(0, TAIL_N)
    col_mask = cols < group_size
    mask = row_mask[:, None] & col_mask[None, :]
    x = tl.load(X + x_rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    g = tl.load(GATE + g_rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    gamma = load_gamma(W, group_offset + cols, col_mask, HAS_WEIGHT, ZERO_CENTERED)
    act, h = gated_tile(x, g, X.dtype.element_ty, ACTIVATION, NORM_BEFORE_GATE, ROUNDING)
    return cols, mask, act, h, gamma


@triton.jit
def store_tail(Y, y_rows, cols, mask, h, rstd, act, gamma, X_DTYPE: tl.constexpr,
               WEIGHT_PRODUCT_ROUNDED: tl.constexpr, HAS_WEIGHT: tl.constexpr,
               NORM_BEFORE_GATE: tl.constexpr, ROUNDING: tl.constexpr):
    """y of a tile's tail (load_tail's cols, mask, act, h, gamma), from its rows' rstd."""
    y = forward_output(h * rstd[:, None], act, gamma, X_DTYPE, WEIGHT_PRODUCT_ROUNDED,
                       HAS_WEIGHT, NORM_BEFORE_GATE, ROUNDING)
    tl.store(Y + y_rows[:, None] + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=RUNTIME_INTS)
def forward_tile_kernel(
    X, GATE, W, Y, RSTD,
    rows, size1, size2,
    stride_x0, stride_x1, stride_x2,
    stride_gate0, stride_gate1, stride_gate2,
    stride_y0, stride_y1, stride_y2,
    group_size, num_groups, eps,
    LEADING_DIMS: tl.constexpr, ROW_ALIGN: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_N: tl.constexpr, TAIL_N: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, ZERO_CENTERED: tl.constexpr, ACTIVATION: tl.constexpr,
    NORM_BEFORE_GATE: tl.constexpr, ROUNDING: tl.constexpr, WEIGHT_PRODUCT_ROUNDED: tl.constexpr,
    STORE_RSTD: tl.constexpr, RSTD_BY_PTX: tl.constexpr,
    GATE_ROWS_AS_X: tl.constexpr, Y_ROWS_AS_X: tl.constexpr,
):
    """A [BLOCK_ROWS, BLOCK_N] tile (and a [BLOCK_ROWS, TAIL_N] tail) holds whole groups:
    one load, one reduction, one store.

    rstd = 1 / sqrt(mean(h^2) + eps),  h = x  or  x * act(gate)
    y    = forward_output(h * rstd, act(gate), gamma)
    """
    eps = fp32_argument(eps)
    pid = tl.program_id(0)
    group = pid % num_groups
    row_block = pid // num_groups
    # int64: near 2**31 rows, the last block's indices would wrap in int32 and pass the mask.
    rows_idx = row_block.to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)  # [BLOCK_ROWS]
    cols = tl.arange(0, BLOCK_N)  # [BLOCK_N]
    row_mask = rows_idx < rows
    col_mask = cols < group_size
    mask = row_mask[:, None] & col_mask[None, :]  # [BLOCK_ROWS, BLOCK_N]
    group_offset = group.to(tl.int64) * group_size

    x_rows = row_offsets(rows_idx, size1, size2, stride_x0, stride_x1, stride_x2, group_offset,
                         LEADING_DIMS, ROW_ALIGN)
    g_rows = row_offsets_or(x_rows, rows_idx, size1, size2, stride_gate0, stride_gate1,
                            stride_gate2, group_offset, LEADING_DIMS, ROW_ALIGN, GATE_ROWS_AS_X)
    y_rows = row_offsets_or(x_rows, rows_idx, size1, size2, stride_y0, stride_y1, stride_y2,
                            group_offset, LEADING_DIMS, ROW_ALIGN, Y_ROWS_AS_X)

    x = tl.load(X + x_rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    g = tl.load(GATE + g_rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    gamma = load_gamma(W, group_offset + cols, col_mask, HAS_WEIGHT, ZERO_CENTERED)  # [BLOCK_N]

    act, h = gated_tile(x, g, X.dtype.element_ty, ACTIVATION, NORM_BEFORE_GATE, ROUNDING)
    sum_square = tl.sum(h * h, axis=1)  # [BLOCK_ROWS]
    if TAIL_N > 0:
        tail_cols, tail_mask, tail_act, tail_h, tail_gamma = load_tail(
            X, GATE, W, x_rows, g_rows, row_mask, group_offset, group_size, BLOCK_N, TAIL_N,
            HAS_WEIGHT, ZERO_CENTERED, ACTIVATION, NORM_BEFORE_GATE, ROUNDING)
        sum_square += tl.sum(tail_h * tail_h, axis=1)
    rstd = 1.0 / tl.sqrt(sum_square / group_size + eps)
    rstd_pointers = RSTD + rows_idx.to(tl.int64) * num_groups + group
    if STORE_RSTD and RSTD_BY_PTX:
        # Before y, so that its pointers and values are not held across y's math.
        store_row_values(rstd_pointers, rstd, row_mask)
    y = forward_output(h * rstd[:, None], act, gamma, X.dtype.element_ty, WEIGHT_PRODUCT_ROUNDED,
                       HAS_WEIGHT, NORM_BEFORE_GATE, ROUNDING)
    tl.store(Y + y_rows[:, None] + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    if TAIL_N > 0:
        store_tail(Y, y_rows, tail_cols, tail_mask, tail_h, rstd, tail_act, tail_gamma,
                   X.dtype.element_ty, WEIGHT_PRODUCT_ROUNDED, HAS_WEIGHT, NORM_BEFORE_GATE,
                   ROUNDING)
    if STORE_RSTD and not RSTD_BY_PTX:
        tl.store(rstd_pointers, rstd, mask=row_mask)


@triton.jit(do_not_specialize=RUNTIME_INTS + ["rows_per_chunk"])
def forward_row_loop_kernel(
    X, GATE, W, Y, RSTD,
    rows, size1, size2,
    stride_x0, stride_x1, stride_x2,
    stride_gate0, stride_gate1, stride_gate2,
    stride_y0, stride_y1, stride_y2,
    group_size, num_groups, rows_per_chunk, eps,
    LEADING_DIMS: tl.constexpr, ROW_ALIGN: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_N: tl.constexpr, TAIL_N: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, ZERO_CENTERED: tl.constexpr, ACTIVATION: tl.constexpr,
    NORM_BEFORE_GATE: tl.constexpr, ROUNDING: tl.constexpr, WEIGHT_PRODUCT_ROUNDED: tl.constexpr,
    STORE_RSTD: tl.constexpr, LOOP_STAGES: tl.constexpr,
):
    """The tile kernel's work for ``rows_per_chunk`` rows, one [BLOCK_ROWS, BLOCK_N] tile at
    a time: program ``pid`` owns group ``pid % num_groups`` of chunk ``pid // num_groups``.

    A program stays resident over its chunk and prefetches the next tiles' x and gate
    (LOOP_STAGES deep) while it computes and stores one, instead of ending after one tile and
    leaving the SM to start another program. Same arithmetic as forward_tile_kernel, per tile.
    """
    eps = fp32_argument(eps)
    pid = tl.program_id(0)
    group = pid % num_groups
    chunk = pid // num_groups
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < group_size
    group_offset = group.to(tl.int64) * group_size
    gamma = load_gamma(W, group_offset + cols, col_mask, HAS_WEIGHT, ZERO_CENTERED)  # [BLOCK_N]
    chunk_start = chunk.to(tl.int64) * rows_per_chunk
    tile_rows = tl.arange(0, BLOCK_ROWS)
    for tile_start in tl.range(0, rows_per_chunk, BLOCK_ROWS, num_stages=LOOP_STAGES):
        rows_idx = chunk_start + tile_start + tile_rows  # [BLOCK_ROWS]
        row_mask = (rows_idx < rows) & (tile_start + tile_rows < rows_per_chunk)
        mask = row_mask[:, None] & col_mask[None, :]  # [BLOCK_ROWS, BLOCK_N]
        # Each tensor its own row offsets and rstd stored after y: the tile kernel's shared
        # offsets and early inline-PTX store measured 1-3 % slower here (variant 27).
        x_rows = row_offsets(rows_idx, size1, size2, stride_x0, stride_x1, stride_x2,
                             group_offset, LEADING_DIMS, ROW_ALIGN)
        g_rows = row_offsets(rows_idx, size1, size2, stride_gate0, stride_gate1, stride_gate2,
                             group_offset, LEADING_DIMS, ROW_ALIGN)
        y_rows = row_offsets(rows_idx, size1, size2, stride_y0, stride_y1, stride_y2,
                             group_offset, LEADING_DIMS, ROW_ALIGN)

        x = tl.load(X + x_rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        g = tl.load(GATE + g_rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        act, h = gated_tile(x, g, X.dtype.element_ty, ACTIVATION, NORM_BEFORE_GATE, ROUNDING)
        sum_square = tl.sum(h * h, axis=1)  # [BLOCK_ROWS]
        if TAIL_N > 0:
            tail_cols, tail_mask, tail_act, tail_h, tail_gamma = load_tail(
                X, GATE, W, x_rows, g_rows, row_mask, group_offset, group_size, BLOCK_N, TAIL_N,
                HAS_WEIGHT, ZERO_CENTERED, ACTIVATION, NORM_BEFORE_GATE, ROUNDING)
            sum_square += tl.sum(tail_h * tail_h, axis=1)
        rstd = 1.0 / tl.sqrt(sum_square / group_size + eps)
        y = forward_output(h * rstd[:, None], act, gamma, X.dtype.element_ty,
                           WEIGHT_PRODUCT_ROUNDED, HAS_WEIGHT, NORM_BEFORE_GATE, ROUNDING)
        tl.store(Y + y_rows[:, None] + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
        if TAIL_N > 0:
            store_tail(Y, y_rows, tail_cols, tail_mask, tail_h, rstd, tail_act, tail_gamma,
                       X.dtype.element_ty, WEIGHT_PRODUCT_ROUNDED, HAS_WEIGHT,
                       NORM_BEFORE_GATE, ROUNDING)
        if STORE_RSTD:
            tl.store(RSTD + rows_idx * num_groups + group, rstd, mask=row_mask)


@triton.jit(do_not_specialize=RUNTIME_INTS)
def forward_long_row_kernel(
    X, GATE, W, Y, RSTD,
    rows, size1, size2,
    stride_x0, stride_x1, stride_x2,
    stride_gate0, stride_gate1, stride_gate2,
    stride_y0, stride_y1, stride_y2,
    group_size, num_groups, eps,
    LEADING_DIMS: tl.constexpr, ROW_ALIGN: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, ZERO_CENTERED: tl.constexpr, ACTIVATION: tl.constexpr,
    NORM_BEFORE_GATE: tl.constexpr, ROUNDING: tl.constexpr, WEIGHT_PRODUCT_ROUNDED: tl.constexpr,
    STORE_RSTD: tl.constexpr, LOOP_STAGES: tl.constexpr,
):
    """One group longer than a register tile, in two passes of BLOCK_N chunks.

    Pass 1 accumulates sum(h^2); pass 2 re-reads x and gate (from L2 for all but the longest
    rows) and writes y. BLOCK_ROWS is 1.
    """
    eps = fp32_argument(eps)
    pid = tl.program_id(0)
    group = pid % num_groups
    row = pid // num_groups
    cols = tl.arange(0, BLOCK_N)
    group_offset = group.to(tl.int64) * group_size
    # One row a program: its offsets are computed once, so no tensor reuses x's.
    x_row = row_offsets(row, size1, size2, stride_x0, stride_x1, stride_x2, group_offset,
                        LEADING_DIMS, ROW_ALIGN)
    g_row = row_offsets(row, size1, size2, stride_gate0, stride_gate1, stride_gate2,
                        group_offset, LEADING_DIMS, ROW_ALIGN)
    y_row = row_offsets(row, size1, size2, stride_y0, stride_y1, stride_y2, group_offset,
                        LEADING_DIMS, ROW_ALIGN)

    sum_square = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in tl.range(0, group_size, BLOCK_N, num_stages=LOOP_STAGES):
        col_mask = start + cols < group_size
        x = tl.load(X + x_row + start + cols, mask=col_mask, other=0.0).to(tl.float32)
        h = x
        if not NORM_BEFORE_GATE:
            g = tl.load(GATE + g_row + start + cols, mask=col_mask, other=0.0).to(tl.float32)
            act, _ = activation_and_slope(g, ACTIVATION)
            h = gated_input(x, act, X.dtype.element_ty, NORM_BEFORE_GATE, ROUNDING)
        sum_square += h * h
    rstd = 1.0 / tl.sqrt(tl.sum(sum_square, axis=0) / group_size + eps)

    for start in tl.range(0, group_size, BLOCK_N, num_stages=LOOP_STAGES):
        col_mask = start + cols < group_size
        x = tl.load(X + x_row + start + cols, mask=col_mask, other=0.0).to(tl.float32)
        g = tl.load(GATE + g_row + start + cols, mask=col_mask, other=0.0).to(tl.float32)
        gamma = load_gamma(W, group_offset + start + cols, col_mask, HAS_WEIGHT, ZERO_CENTERED)
        act, _ = activation_and_slope(g, ACTIVATION)
        h = gated_input(x, act, X.dtype.element_ty, NORM_BEFORE_GATE, ROUNDING)
        y = forward_output(h * rstd, act, gamma, X.dtype.element_ty, WEIGHT_PRODUCT_ROUNDED,
                           HAS_WEIGHT, NORM_BEFORE_GATE, ROUNDING)
        tl.store(Y + y_row + start + cols, y.to(Y.dtype.element_ty), mask=col_mask)
    if STORE_RSTD:
        tl.store(RSTD + row.to(tl.int64) * num_groups + group, rstd)
