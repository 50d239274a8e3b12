"""Backward kernels: dx, dgate, and fp32 dweight partials reduced in a fixed order.

Rows are split into chunks of ``rows_per_chunk`` (a function of the row count and the group
size only, never of the GPU), so the partial sums, and therefore dweight, have the same bits on
every run and every GPU. Program ``pid`` owns group ``pid % num_groups`` of chunk
``pid // num_groups`` and writes its whole dweight partial row, even when the chunk is empty.

    h_hat     = h * rstd                       (h = x, or x * act(gate) gate-first)
    grad_hhat = d loss / d h_hat, gamma included          (backward_pointwise)
    grad_h    = rstd * (grad_hhat - h_hat * mean(grad_hhat * h_hat))
"""

import triton
import triton.language as tl

from gatednorm.kernels.pointwise import (
    activation_and_slope,
    backward_inputs,
    backward_pointwise,
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
    "num_groups", "rows_per_chunk",
]


@triton.jit(do_not_specialize=RUNTIME_INTS)
def backward_tile_kernel(
    X, GATE, W, DY, RSTD, DX, DGATE, DW_PARTIAL,
    rows, size1, size2,
    stride_x0, stride_x1, stride_x2,
    stride_gate0, stride_gate1, stride_gate2,
    stride_dy0, stride_dy1, stride_dy2,
    stride_dx0, stride_dx1, stride_dx2,
    stride_dgate0, stride_dgate1, stride_dgate2,
    group_size, num_groups, rows_per_chunk, weight_size,
    LEADING_DIMS: tl.constexpr, ROW_ALIGN: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_N: tl.constexpr, LOOP_STAGES: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, ZERO_CENTERED: tl.constexpr, ACTIVATION: tl.constexpr,
    NORM_BEFORE_GATE: tl.constexpr, ROUNDING: tl.constexpr, WEIGHT_PRODUCT_ROUNDED: tl.constexpr,
    GATE_ROWS_AS_X: tl.constexpr, DY_ROWS_AS_X: tl.constexpr, DX_ROWS_AS_X: tl.constexpr,
    DGATE_ROWS_AS_X: tl.constexpr,
):
    """Whole groups in [BLOCK_ROWS, BLOCK_N] tiles, looping over the chunk's rows.

    A tensor whose row strides equal x's (*_ROWS_AS_X, set by the launcher) is addressed
    with x's row offsets."""
    pid = tl.program_id(0)
    group = pid % num_groups
    chunk = pid // num_groups
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < group_size
    group_offset = group.to(tl.int64) * group_size
    X_DTYPE: tl.constexpr = X.dtype.element_ty
    G_DTYPE: tl.constexpr = GATE.dtype.element_ty

    gamma = load_gamma(W, group_offset + cols, col_mask, HAS_WEIGHT, ZERO_CENTERED)  # [BLOCK_N]
    dweight = tl.zeros([BLOCK_N], dtype=tl.float32)

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
            # The launcher sets ROW_ALIGN to 8 only when every row start is a multiple of 8
            # elements: 16-byte loads and stores. A tensor addressed like x leaves its own
            # stepped offsets unused (the compiler drops them).
            x_rows = x_units * ROW_ALIGN
            g_rows = x_rows if GATE_ROWS_AS_X else g_units * ROW_ALIGN
            dy_rows = x_rows if DY_ROWS_AS_X else dy_units * ROW_ALIGN
            dx_rows = x_rows if DX_ROWS_AS_X else dx_units * ROW_ALIGN
            dgate_rows = x_rows if DGATE_ROWS_AS_X else dgate_units * ROW_ALIGN
        x = tl.load(X + x_rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        g = tl.load(GATE + g_rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + dy_rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows_idx * num_groups + group, mask=row_mask, other=0.0)

        act, slope = activation_and_slope(g, ACTIVATION)
        h_hat = gated_input(x, act, X_DTYPE, NORM_BEFORE_GATE, ROUNDING) * rstd[:, None]
        grad_hhat, dweight_term, dgate = backward_pointwise(
            act, slope, dy, h_hat, gamma, X_DTYPE, G_DTYPE, WEIGHT_PRODUCT_ROUNDED, HAS_WEIGHT,
            NORM_BEFORE_GATE, ROUNDING)
        mean_term = tl.sum(grad_hhat * h_hat, axis=1) / group_size  # [BLOCK_ROWS]
        grad_h = rstd[:, None] * (grad_hhat - h_hat * mean_term[:, None])
        dx, dgate = backward_inputs(x, grad_h, act, slope, dgate, X_DTYPE, G_DTYPE,
                                    NORM_BEFORE_GATE, ROUNDING)
        tl.store(DX + dx_rows[:, None] + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        tl.store(DGATE + dgate_rows[:, None] + cols[None, :], dgate.to(DGATE.dtype.element_ty),
                 mask=mask)
        if HAS_WEIGHT:
            dweight += tl.sum(tl.where(mask, dweight_term, 0.0), axis=0)

        if LEADING_DIMS == 2:  # the next tile's row offsets
            inner += inner_step
            wrapped = inner >= size2  # these rows crossed into the next outer index
            inner = tl.where(wrapped, inner - size2, inner)
            x_units += tl.where(wrapped, x_wrap, x_step)
            g_units += tl.where(wrapped, g_wrap, g_step)
            dy_units += tl.where(wrapped, dy_wrap, dy_step)
            dx_units += tl.where(wrapped, dx_wrap, dx_step)
            dgate_units += tl.where(wrapped, dgate_wrap, dgate_step)

    if HAS_WEIGHT:
        tl.store(DW_PARTIAL + chunk.to(tl.int64) * weight_size + group_offset + cols, dweight,
                 mask=col_mask)


@triton.jit
def _long_row_chunk(X, GATE, W, DY, x_row, g_row, dy_row, group_offset, start, cols, rstd,
                    group_size, HAS_WEIGHT: tl.constexpr, ZERO_CENTERED: tl.constexpr,
                    ACTIVATION: tl.constexpr, NORM_BEFORE_GATE: tl.constexpr,
                    ROUNDING: tl.constexpr, WEIGHT_PRODUCT_ROUNDED: tl.constexpr):
    """Load one BLOCK_N chunk of a long row and compute its pointwise backward terms; both
    passes of backward_long_row_kernel recompute them rather than keep a row in registers."""
    col_mask = start + cols < group_size
    x = tl.load(X + x_row + start + cols, mask=col_mask, other=0.0).to(tl.float32)
    g = tl.load(GATE + g_row + start + cols, mask=col_mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + dy_row + start + cols, mask=col_mask, other=0.0).to(tl.float32)
    gamma = load_gamma(W, group_offset + start + cols, col_mask, HAS_WEIGHT, ZERO_CENTERED)
    act, slope = activation_and_slope(g, ACTIVATION)
    h_hat = gated_input(x, act, X.dtype.element_ty, NORM_BEFORE_GATE, ROUNDING) * rstd
    grad_hhat, dweight_term, dgate = backward_pointwise(
        act, slope, dy, h_hat, gamma, X.dtype.element_ty, GATE.dtype.element_ty,
        WEIGHT_PRODUCT_ROUNDED, HAS_WEIGHT, NORM_BEFORE_GATE, ROUNDING)
    return x, act, slope, h_hat, grad_hhat, dweight_term, dgate


@triton.jit(do_not_specialize=RUNTIME_INTS)
def backward_long_row_kernel(
    X, GATE, W, DY, RSTD, DX, DGATE, DW_PARTIAL,
    rows, size1, size2,
    stride_x0, stride_x1, stride_x2,
    stride_gate0, stride_gate1, stride_gate2,
    stride_dy0, stride_dy1, stride_dy2,
    stride_dx0, stride_dx1, stride_dx2,
    stride_dgate0, stride_dgate1, stride_dgate2,
    group_size, num_groups, rows_per_chunk, weight_size,
    LEADING_DIMS: tl.constexpr, ROW_ALIGN: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_N: tl.constexpr, LOOP_STAGES: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, ZERO_CENTERED: tl.constexpr, ACTIVATION: tl.constexpr,
    NORM_BEFORE_GATE: tl.constexpr, ROUNDING: tl.constexpr, WEIGHT_PRODUCT_ROUNDED: tl.constexpr,
):
    """Groups longer than a register tile: per row, pass 1 reduces mean(grad_hhat * h_hat)
    over BLOCK_N chunks, pass 2 recomputes each chunk and writes dx and dgate. The dweight
    partial row is this program's own, zero-filled by the launcher, and updated in place."""
    pid = tl.program_id(0)
    group = pid % num_groups
    chunk = pid // num_groups
    cols = tl.arange(0, BLOCK_N)
    group_offset = group.to(tl.int64) * group_size
    X_DTYPE: tl.constexpr = X.dtype.element_ty
    G_DTYPE: tl.constexpr = GATE.dtype.element_ty
    partial_row = DW_PARTIAL + chunk.to(tl.int64) * weight_size + group_offset

    chunk_start = chunk.to(tl.int64) * rows_per_chunk
    for row_in_chunk in range(0, rows_per_chunk):
        row = chunk_start + row_in_chunk
        if row < rows:
            x_row = row_offsets(row, size1, size2, stride_x0, stride_x1, stride_x2,
                                group_offset, LEADING_DIMS, ROW_ALIGN)
            g_row = row_offsets(row, size1, size2, stride_gate0, stride_gate1, stride_gate2,
                                group_offset, LEADING_DIMS, ROW_ALIGN)
            dy_row = row_offsets(row, size1, size2, stride_dy0, stride_dy1, stride_dy2,
                                 group_offset, LEADING_DIMS, ROW_ALIGN)
            dx_row = row_offsets(row, size1, size2, stride_dx0, stride_dx1, stride_dx2,
                                 group_offset, LEADING_DIMS, ROW_ALIGN)
            dgate_row = row_offsets(row, size1, size2, stride_dgate0, stride_dgate1, stride_dgate2,
                                    group_offset, LEADING_DIMS, ROW_ALIGN)
            rstd = tl.load(RSTD + row * num_groups + group)

            dot = tl.zeros([BLOCK_N], dtype=tl.float32)
            for start in tl.range(0, group_size, BLOCK_N, num_stages=LOOP_STAGES):
                _, _, _, h_hat, grad_hhat, _, _ = _long_row_chunk(
                    X, GATE, W, DY, x_row, g_row, dy_row, group_offset, start, cols, rstd,
                    group_size, HAS_WEIGHT, ZERO_CENTERED, ACTIVATION, NORM_BEFORE_GATE,
                    ROUNDING, WEIGHT_PRODUCT_ROUNDED)
                dot += grad_hhat * h_hat
            mean_term = tl.sum(dot, axis=0) / group_size

            for start in tl.range(0, group_size, BLOCK_N, num_stages=LOOP_STAGES):
                col_mask = start + cols < group_size
                x, act, slope, h_hat, grad_hhat, dweight_term, dgate = _long_row_chunk(
                    X, GATE, W, DY, x_row, g_row, dy_row, group_offset, start, cols, rstd,
                    group_size, HAS_WEIGHT, ZERO_CENTERED, ACTIVATION, NORM_BEFORE_GATE,
                    ROUNDING, WEIGHT_PRODUCT_ROUNDED)
                grad_h = rstd * (grad_hhat - h_hat * mean_term)
                dx, dgate = backward_inputs(x, grad_h, act, slope, dgate, X_DTYPE, G_DTYPE,
                                            NORM_BEFORE_GATE, ROUNDING)
                tl.store(DX + dx_row + start + cols, dx.to(DX.dtype.element_ty), mask=col_mask)
                tl.store(DGATE + dgate_row + start + cols, dgate.to(DGATE.dtype.element_ty),
                         mask=col_mask)
                if HAS_WEIGHT:
                    partial = tl.load(partial_row + start + cols, mask=col_mask, other=0.0)
                    tl.store(partial_row + start + cols, partial + dweight_term, mask=col_mask)


@triton.jit(do_not_specialize=["num_chunks"])
def dweight_reduce_kernel(PARTIAL, OUT, num_chunks, weight_size,
                          BLOCK_CHUNKS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    """One level of a fixed reduction tree over the chunk partials.

    Program (c, k) writes OUT[k, c*BLOCK_COLS : +BLOCK_COLS] = sum of PARTIAL rows
    [k*BLOCK_CHUNKS, +BLOCK_CHUNKS). The launcher runs two levels, so the order of the
    additions depends only on the number of chunks.
    """
    cols = tl.program_id(0) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    chunk_idx = tl.program_id(1) * BLOCK_CHUNKS + tl.arange(0, BLOCK_CHUNKS)
    mask = (chunk_idx < num_chunks)[:, None] & (cols < weight_size)[None, :]
    offsets = chunk_idx.to(tl.int64)[:, None] * weight_size + cols[None, :]
    total = tl.sum(tl.load(PARTIAL + offsets, mask=mask, other=0.0), axis=0)
    out_offsets = tl.program_id(1).to(tl.int64) * weight_size + cols
    tl.store(OUT + out_offsets, total.to(OUT.dtype.element_ty), mask=cols < weight_size)
