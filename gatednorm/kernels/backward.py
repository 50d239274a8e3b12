"""Backward kernels: dx, dgate, and fp32 dweight partials reduced in a fixed order.

Rows are split into chunks of ``rows_per_chunk`` (a function of the row count and the group
size only, never of the GPU), so the partial sums, and therefore dweight, have the same bits on
every run and every GPU. Program ``pid`` owns column block ``pid % column_blocks`` of chunk
``pid // column_blocks`` and writes its whole dweight partial row, even when the chunk is empty.
A column block is a whole group, or, for groups wider than a register tile (SPLIT_PASS), one
BLOCK_N-wide part of a group: a first launch writes each row's dot product over each part, a
second sums them in a fixed order and writes dx and dgate.

    h_hat     = h * rstd                       (h = x, or x * act(gate) gate-first)
    grad_hhat = d loss / d h_hat, gamma included          (backward_pointwise)
    grad_h    = rstd * (grad_hhat - h_hat * mean(grad_hhat * h_hat))
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from gatednorm.kernels.pointwise import (
    activation_and_slope,
    backward_inputs,
    backward_pointwise,
    fp32_argument,
    gated_input,
    load_gamma,
    row_offsets,
    row_offsets_or,
    row_step,
)

RUNTIME_INTS = [
    "rows", "size1", "size2",
    "stride_x0", "stride_x1", "stride_x2",
    "stride_gate0", "stride_gate1", "stride_gate2",
    "stride_dy0", "stride_dy1", "stride_dy2",
    "stride_dx0", "stride_dx1", "stride_dx2",
    "stride_dgate0", "stride_dgate1", "stride_dgate2",
    "num_groups", "column_blocks", "rows_per_chunk",
]

# SPLIT_PASS values of backward_tile_kernel (constexpr: a jit function may read a global
# only when it is one).
WHOLE_GROUPS = tl.constexpr(0)  # a tile holds whole groups: one launch
ROW_DOTS_PASS = tl.constexpr(1)  # write each row's dot product over the block to ROW_DOTS
INPUT_GRADS_PASS = tl.constexpr(2)  # sum a row's dot products, write dx, dgate, dweight


@triton.jit
def tile_terms(x, g, dy, rstd, gamma, X_DTYPE: tl.constexpr, G_DTYPE: tl.constexpr,
               ACTIVATION: tl.constexpr, WEIGHT_PRODUCT_ROUNDED: tl.constexpr,
               HAS_WEIGHT: tl.constexpr, NORM_BEFORE_GATE: tl.constexpr,
               ROUNDING: tl.constexpr):
    """(act, slope, h_hat, grad_hhat, dweight_term, dgate) of a tile of x, gate and dy."""
    act, slope = activation_and_slope(g, ACTIVATION)
    h_hat = gated_input(x, act, X_DTYPE, NORM_BEFORE_GATE, ROUNDING) * rstd[:, None]
    grad_hhat, dweight_term, dgate = backward_pointwise(
        act, slope, dy, h_hat, gamma, X_DTYPE, G_DTYPE, WEIGHT_PRODUCT_ROUNDED, HAS_WEIGHT,
        NORM_BEFORE_GATE, ROUNDING)
    return act, slope, h_hat, grad_hhat, dweight_term, dgate


@triton.jit
def store_input_grads(DX, DGATE, dx_rows, dgate_rows, cols, mask, x, act, slope, h_hat,
                      grad_hhat, dweight_term, dgate, rstd, mean_term, eps, dweight,
                      X_DTYPE: tl.constexpr, G_DTYPE: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                      NORM_BEFORE_GATE: tl.constexpr, ROUNDING: tl.constexpr,
                      GROUP_OF_ONE: tl.constexpr):
    """Write a tile's dx and dgate (tile_terms' values, the rows' mean_term) and return
    ``dweight`` plus the tile's column sums of dweight_term.

    GROUP_OF_ONE: grad_h = rstd * grad_hhat * (1 - h_hat^2), and where h^2 > eps the
    subtraction keeps only a few bits in fp32; 1 - h_hat^2 is exactly eps / (h^2 + eps),
    formed that way when eps is known (eps >= 0; the launcher passes -1 when it is not)."""
    grad_h = rstd[:, None] * (grad_hhat - h_hat * mean_term[:, None])
    if GROUP_OF_ONE:
        h = gated_input(x, act, X_DTYPE, NORM_BEFORE_GATE, ROUNDING)
        complement = eps / (h * h + eps)
        grad_h = tl.where(eps >= 0, rstd[:, None] * grad_hhat * complement, grad_h)
    dx, dgate = backward_inputs(x, grad_h, act, slope, dgate, X_DTYPE, G_DTYPE,
                                NORM_BEFORE_GATE, ROUNDING)
    tl.store(DX + dx_rows[:, None] + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
    tl.store(DGATE + dgate_rows[:, None] + cols[None, :], dgate.to(DGATE.dtype.element_ty),
             mask=mask)
    if HAS_WEIGHT:
        dweight += tl.sum(tl.where(mask, dweight_term, 0.0), axis=0)
    return dweight


@triton.jit(do_not_specialize=RUNTIME_INTS)
def backward_tile_kernel(
    X, GATE, W, DY, RSTD, DX, DGATE, DW_PARTIAL, ROW_DOTS,
    rows, size1, size2,
    stride_x0, stride_x1, stride_x2,
    stride_gate0, stride_gate1, stride_gate2,
    stride_dy0, stride_dy1, stride_dy2,
    stride_dx0, stride_dx1, stride_dx2,
    stride_dgate0, stride_dgate1, stride_dgate2,
    group_size, num_groups, column_blocks, rows_per_chunk, weight_size, eps,
    LEADING_DIMS: tl.constexpr, ROW_ALIGN: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_N: tl.constexpr, TAIL_N: tl.constexpr,
    LOOP_STAGES: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, ZERO_CENTERED: tl.constexpr, ACTIVATION: tl.constexpr,
    NORM_BEFORE_GATE: tl.constexpr, ROUNDING: tl.constexpr, WEIGHT_PRODUCT_ROUNDED: tl.constexpr,
    GATE_ROWS_AS_X: tl.constexpr, DY_ROWS_AS_X: tl.constexpr, DX_ROWS_AS_X: tl.constexpr,
    DGATE_ROWS_AS_X: tl.constexpr, SPLIT_PASS: tl.constexpr, DOT_BLOCKS: tl.constexpr,
    WAIT_FOR_PRIOR_GRID: tl.constexpr,
):
    """[BLOCK_ROWS, BLOCK_N] tiles of one column block, looping over the chunk's rows.

    SPLIT_PASS = WHOLE_GROUPS: a column block is a group (column_blocks = num_groups).
    Otherwise each group is cut into column_blocks // num_groups blocks of BLOCK_N columns
    (at most DOT_BLOCKS), ROW_DOTS is fp32 [rows, column_blocks], and the kernel runs twice:
    ROW_DOTS_PASS writes each row's sum of grad_hhat * h_hat over the block, INPUT_GRADS_PASS
    adds a row's sums in block order (the same bits every run) for the mean and writes dx,
    dgate and the dweight partial of its columns. Every element is loaded twice from memory,
    16 bytes an element in 16-bit dtypes instead of 10, but both launches are tile kernels
    with the whole GPU's parallelism, where one program walking a long row's columns twice
    serializes each row on a few warps.

    TAIL_N > 0 (whole groups only): a group is held as BLOCK_N columns and a tail tile of
    TAIL_N more (config.head_and_tail: 192 = 128 + 64), not one padded power-of-two tile;
    the row's dot product adds both tiles' sums, and each tile writes its own columns.

    A tensor whose row strides equal x's (*_ROWS_AS_X, set by the launcher) is addressed
    with x's row offsets.

    WAIT_FOR_PRIOR_GRID (programmatic dependent launch, sm_90+): wait for the previous
    launch's writes before reading anything."""
    if WAIT_FOR_PRIOR_GRID:
        gdc_wait()
    eps = fp32_argument(eps)
    pid = tl.program_id(0)
    column_block = pid % column_blocks
    chunk = pid // column_blocks
    if SPLIT_PASS == WHOLE_GROUPS:
        group = column_block
        blocks_per_group = 1
        block_start = 0
    else:
        blocks_per_group = column_blocks // num_groups
        group = column_block // blocks_per_group
        block_start = (column_block % blocks_per_group) * BLOCK_N
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < group_size - block_start
    # Offset of the block's first column in a row (the group's, without a split).
    group_offset = group.to(tl.int64) * group_size + block_start
    X_DTYPE: tl.constexpr = X.dtype.element_ty
    G_DTYPE: tl.constexpr = GATE.dtype.element_ty

    gamma = load_gamma(W, group_offset + cols, col_mask, HAS_WEIGHT, ZERO_CENTERED)  # [BLOCK_N]
    dweight = tl.zeros([BLOCK_N], dtype=tl.float32)
    if TAIL_N > 0:  # whole groups only: columns [BLOCK_N, BLOCK_N + TAIL_N) of each group
        tail_cols = BLOCK_N + tl.arange(0, TAIL_N)
        tail_col_mask = tail_cols < group_size
        tail_gamma = load_gamma(W, group_offset + tail_cols, tail_col_mask, HAS_WEIGHT,
                                ZERO_CENTERED)
        tail_dweight = tl.zeros([TAIL_N], dtype=tl.float32)

    chunk_start = chunk.to(tl.int64) * rows_per_chunk
    tile_rows = tl.arange(0, BLOCK_ROWS)
    # Row offsets of the chunk's first tile. With two leading dims (a gate sliced from a
    # projection), later tiles step them by BLOCK_ROWS rows (row_step) instead of recomputing
    # them from the row index: the recomputation (a division and a 64-bit multiply per row
    # and tensor) was a sixth of the loop's instructions, in a loop bound by instruction issue.
    # One or three leading dims recompute them per tile (stepping measured slower with one).
    if LEADING_DIMS == 2:
        first_rows = chunk_start + tile_rows
        x_units = row_offsets(first_rows, size1, size2, stride_x0, stride_x1, stride_x2,
                              group_offset, LEADING_DIMS, 1)
        g_units = row_offsets(first_rows, size1, size2, stride_gate0, stride_gate1,
                              stride_gate2, group_offset, LEADING_DIMS, 1)
        dy_units = row_offsets(first_rows, size1, size2, stride_dy0, stride_dy1, stride_dy2,
                               group_offset, LEADING_DIMS, 1)
        dx_units = row_offsets(first_rows, size1, size2, stride_dx0, stride_dx1, stride_dx2,
                               group_offset, LEADING_DIMS, 1)
        dgate_units = row_offsets(first_rows, size1, size2, stride_dgate0, stride_dgate1,
                                  stride_dgate2, group_offset, LEADING_DIMS, 1)
        # Carried in units of ROW_ALIGN elements: a loop-carried value cannot hold Triton's
        # multiple_of hint, but units * ROW_ALIGN is a known multiple (16-byte loads stay).
        x_units = x_units // ROW_ALIGN
        g_units = g_units // ROW_ALIGN
        dy_units = dy_units // ROW_ALIGN
        dx_units = dx_units // ROW_ALIGN
        dgate_units = dgate_units // ROW_ALIGN
        inner = (first_rows.to(tl.int32) % size2)  # position in the innermost leading dim
        x_step, x_wrap = row_step(size2, stride_x1, stride_x2, BLOCK_ROWS, ROW_ALIGN)
        g_step, g_wrap = row_step(size2, stride_gate1, stride_gate2, BLOCK_ROWS, ROW_ALIGN)
        dy_step, dy_wrap = row_step(size2, stride_dy1, stride_dy2, BLOCK_ROWS, ROW_ALIGN)
        dx_step, dx_wrap = row_step(size2, stride_dx1, stride_dx2, BLOCK_ROWS, ROW_ALIGN)
        dgate_step, dgate_wrap = row_step(size2, stride_dgate1, stride_dgate2, BLOCK_ROWS,
                                          ROW_ALIGN)
        inner_step = BLOCK_ROWS % size2

    # LOOP_STAGES > 1 lets Triton prefetch the next tile's loads (cp.async) while this one
    # computes and stores: a program otherwise has one tile of loads in flight at a time.
    for tile_start in tl.range(0, rows_per_chunk, BLOCK_ROWS, num_stages=LOOP_STAGES):
        rows_idx = chunk_start + tile_start + tile_rows  # [BLOCK_ROWS]
        row_mask = (rows_idx < rows) & (tile_start + tile_rows < rows_per_chunk)
        mask = row_mask[:, None] & col_mask[None, :]  # [BLOCK_ROWS, BLOCK_N]
        if LEADING_DIMS != 2:
            x_rows = row_offsets(rows_idx, size1, size2, stride_x0, stride_x1, stride_x2,
                                 group_offset, LEADING_DIMS, ROW_ALIGN)
            g_rows = row_offsets_or(x_rows, rows_idx, size1, size2, stride_gate0, stride_gate1,
                                    stride_gate2, group_offset, LEADING_DIMS, ROW_ALIGN,
                                    GATE_ROWS_AS_X)
            dy_rows = row_offsets_or(x_rows, rows_idx, size1, size2, stride_dy0, stride_dy1,
                                     stride_dy2, group_offset, LEADING_DIMS, ROW_ALIGN,
                                     DY_ROWS_AS_X)
            dx_rows = row_offsets_or(x_rows, rows_idx, size1, size2, stride_dx0, stride_dx1,
                                     stride_dx2, group_offset, LEADING_DIMS, ROW_ALIGN,
                                     DX_ROWS_AS_X)
            dgate_rows = row_offsets_or(x_rows, rows_idx, size1, size2, stride_dgate0,
                                        stride_dgate1, stride_dgate2, group_offset,
                                        LEADING_DIMS, ROW_ALIGN, DGATE_ROWS_AS_X)
        else:
            # Every row start is a multiple of ROW_ALIGN elements (row_offsets), so the
            # loads and stores stay that wide. A tensor addressed like x leaves its own
            # stepped offsets unused (the compiler drops them).
            x_rows = x_units * ROW_ALIGN
            g_rows = x_rows if GATE_ROWS_AS_X else g_units * ROW_ALIGN
            dy_rows = x_rows if DY_ROWS_AS_X else dy_units * ROW_ALIGN
            dx_rows = x_rows if DX_ROWS_AS_X else dx_units * ROW_ALIGN
            dgate_rows = x_rows if DGATE_ROWS_AS_X else dgate_units * ROW_ALIGN
        # The loads stay inline: through a helper, ptxas schedules D = 1024 (norm first) 8
        # instructions longer.
        x = tl.load(X + x_rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        g = tl.load(GATE + g_rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + dy_rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows_idx * num_groups + group, mask=row_mask, other=0.0)
        act, slope, h_hat, grad_hhat, dweight_term, dgate = tile_terms(
            x, g, dy, rstd, gamma, X_DTYPE, G_DTYPE, ACTIVATION, WEIGHT_PRODUCT_ROUNDED,
            HAS_WEIGHT, NORM_BEFORE_GATE, ROUNDING)
        if TAIL_N > 0:
            tail_mask = row_mask[:, None] & tail_col_mask[None, :]
            tail_x = tl.load(X + x_rows[:, None] + tail_cols[None, :], mask=tail_mask,
                             other=0.0).to(tl.float32)
            tail_g = tl.load(GATE + g_rows[:, None] + tail_cols[None, :], mask=tail_mask,
                             other=0.0).to(tl.float32)
            tail_dy = tl.load(DY + dy_rows[:, None] + tail_cols[None, :], mask=tail_mask,
                              other=0.0).to(tl.float32)
            (tail_act, tail_slope, tail_h_hat, tail_grad_hhat, tail_dweight_term,
             tail_dgate) = tile_terms(tail_x, tail_g, tail_dy, rstd, tail_gamma, X_DTYPE,
                                      G_DTYPE, ACTIVATION, WEIGHT_PRODUCT_ROUNDED, HAS_WEIGHT,
                                      NORM_BEFORE_GATE, ROUNDING)
        if SPLIT_PASS == ROW_DOTS_PASS:
            tl.store(ROW_DOTS + rows_idx * column_blocks + column_block,
                     tl.sum(grad_hhat * h_hat, axis=1), mask=row_mask)
        else:
            if SPLIT_PASS == WHOLE_GROUPS:
                row_dot = tl.sum(grad_hhat * h_hat, axis=1)  # [BLOCK_ROWS]
                if TAIL_N > 0:
                    row_dot += tl.sum(tail_grad_hhat * tail_h_hat, axis=1)
                mean_term = row_dot / group_size
            else:
                blocks = tl.arange(0, DOT_BLOCKS)
                dots = tl.load(
                    ROW_DOTS + rows_idx[:, None] * column_blocks
                    + (group * blocks_per_group + blocks)[None, :],
                    mask=row_mask[:, None] & (blocks < blocks_per_group)[None, :], other=0.0)
                mean_term = tl.sum(dots, axis=1) / group_size
            dweight = store_input_grads(
                DX, DGATE, dx_rows, dgate_rows, cols, mask, x, act, slope, h_hat, grad_hhat,
                dweight_term, dgate, rstd, mean_term, eps, dweight, X_DTYPE, G_DTYPE,
                HAS_WEIGHT, NORM_BEFORE_GATE, ROUNDING,
                BLOCK_N == 1 and SPLIT_PASS == WHOLE_GROUPS)
            if TAIL_N > 0:
                tail_dweight = store_input_grads(
                    DX, DGATE, dx_rows, dgate_rows, tail_cols, tail_mask, tail_x, tail_act,
                    tail_slope, tail_h_hat, tail_grad_hhat, tail_dweight_term, tail_dgate, rstd,
                    mean_term, eps, tail_dweight, X_DTYPE, G_DTYPE, HAS_WEIGHT,
                    NORM_BEFORE_GATE, ROUNDING, False)

        if LEADING_DIMS == 2:  # the next tile's row offsets
            inner += inner_step
            wrapped = inner >= size2  # these rows crossed into the next outer index
            inner = tl.where(wrapped, inner - size2, inner)
            x_units += tl.where(wrapped, x_wrap, x_step)
            g_units += tl.where(wrapped, g_wrap, g_step)
            dy_units += tl.where(wrapped, dy_wrap, dy_step)
            dx_units += tl.where(wrapped, dx_wrap, dx_step)
            dgate_units += tl.where(wrapped, dgate_wrap, dgate_step)

    if HAS_WEIGHT and SPLIT_PASS != ROW_DOTS_PASS:
        tl.store(DW_PARTIAL + chunk.to(tl.int64) * weight_size + group_offset + cols, dweight,
                 mask=col_mask)
        if TAIL_N > 0:
            tl.store(DW_PARTIAL + chunk.to(tl.int64) * weight_size + group_offset + tail_cols,
                     tail_dweight, mask=tail_col_mask)


@triton.jit(do_not_specialize=["num_chunks"])
def dweight_reduce_kernel(PARTIAL, OUT, num_chunks, weight_size,
                          BLOCK_CHUNKS: tl.constexpr, BLOCK_COLS: tl.constexpr,
                          WAIT_FOR_PRIOR_GRID: tl.constexpr):
    """One level of a fixed reduction tree over the chunk partials.

    Program (c, k) writes OUT[k, c*BLOCK_COLS : +BLOCK_COLS] = sum of PARTIAL rows
    [k*BLOCK_CHUNKS, +BLOCK_CHUNKS). The launcher runs two levels, so the order of the
    additions depends only on the number of chunks. WAIT_FOR_PRIOR_GRID as in
    backward_tile_kernel: the partials are read only after the wait.
    """
    cols = tl.program_id(0) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    chunk_idx = tl.program_id(1) * BLOCK_CHUNKS + tl.arange(0, BLOCK_CHUNKS)
    mask = (chunk_idx < num_chunks)[:, None] & (cols < weight_size)[None, :]
    offsets = chunk_idx.to(tl.int64)[:, None] * weight_size + cols[None, :]
    if WAIT_FOR_PRIOR_GRID:
        gdc_wait()
    total = tl.sum(tl.load(PARTIAL + offsets, mask=mask, other=0.0), axis=0)
    out_offsets = tl.program_id(1).to(tl.int64) * weight_size + cols
    tl.store(OUT + out_offsets, total.to(OUT.dtype.element_ty), mask=cols < weight_size)
