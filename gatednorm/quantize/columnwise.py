"""The quantized forward with a columnwise copy, for the consumer's weight-gradient GEMM.

Besides the rowwise output (1x128 or MXFP8 blocks along K), the columnwise copy quantizes
blocks of QUANT_BLOCK consecutive tokens of one column (128x1, or 32x1 for MXFP8) and stores
the data transposed, [K, tokens], with scales [K, ceil(tokens / QUANT_BLOCK)] row-major: the
rowwise quantization of y^T (a partial last token block takes the amax of the tokens it has).

A program computes y once for a whole token block of one tile: [QUANT_BLOCK, WIDTH], the op's
tile for the group size grown to QUANT_BLOCK rows (more warps, the same lanes along a row,
so each row's sum of squares adds in the op's order). The column maxima reduce over its rows;
both copies are quantized from the same registers. DRAM traffic is one read of x and the gate
and both outputs. The launcher takes this kernel where the tile is at most 128 wide
(quantize.launch.fused_kernel_tiling).

Wider groups (Mamba2, Nemotron-H) and groups that do not nest with the block take the op's
forward, then quantize_columnwise_kernel: both copies of y from one read of it, in the same
[QUANT_BLOCK, 128] tiles.
"""

import triton
import triton.language as tl

from gatednorm.kernels.pointwise import fp32_argument
from gatednorm.quantize.kernels import (
    RUNTIME_INTS,
    apply_scale,
    block_magnitude,
    block_scale,
    fp8_codes,
    quantize_tile,
    tile_outputs,
)


@triton.jit
def column_maxima(y, rows_idx, row_mask, valid_cols, WIDTH: tl.constexpr):
    """max |y| over the rows of a [rows, WIDTH] tile, per column (NaN ignored, masked lanes 0)."""
    mask = row_mask[:, None] & (tl.arange(0, WIDTH) < valid_cols)[None, :]
    return tl.max(block_magnitude(y, mask), axis=0)  # [WIDTH]


@triton.jit
def store_column_scales(amax, col0, valid_cols, SCALE_T, token_blocks, token_block,
                        WIDTH: tl.constexpr, SCALE_KIND: tl.constexpr):
    """Store the scales of one token block of WIDTH columns from their maxima ``amax``."""
    cols = tl.arange(0, WIDTH)
    stored, _, _, _ = block_scale(amax, SCALE_KIND)
    tl.store(SCALE_T + (col0 + cols) * token_blocks + token_block, stored,
             mask=cols < valid_cols)


@triton.jit
def store_columnwise(y, rows_idx, row_mask, col0, valid_cols, amax, QT, rows,
                     WIDTH: tl.constexpr, SCALE_KIND: tl.constexpr, QT_ALIGN: tl.constexpr):
    """Store a [rows, WIDTH] tile of y (columns from ``col0``) into the transposed copy, in
    units of its columns' scales from ``amax`` [WIDTH]. QT_ALIGN: what the token count
    ``rows`` (QT's row stride) is a multiple of, stated as Q_ALIGN is (quantize_tile)."""
    cols = tl.arange(0, WIDTH)
    col_mask = cols < valid_cols
    _, divisor, multiplier, prescale = block_scale(amax, SCALE_KIND)  # [WIDTH] each
    codes = fp8_codes(apply_scale(y, divisor[None, :], multiplier[None, :], prescale[None, :],
                                  SCALE_KIND))
    # ``rows`` rewritten as a product with QT_ALIGN (the same value: the launcher passes
    # QT_ALIGN only where it divides rows), so that the compiler knows QT's rows start on
    # QT_ALIGN bytes and runs of QT_ALIGN tokens are all in or all out of range: the stores
    # along the tokens can be that wide.
    tokens = (rows // QT_ALIGN) * QT_ALIGN
    mask = (rows_idx < tokens)[:, None] & col_mask[None, :]
    qt_rows = (col0 + cols) * tokens  # [WIDTH]
    tl.store(QT + qt_rows[None, :] + rows_idx[:, None], codes, mask=mask)


@triton.jit
def store_both_copies(y, rows_idx, row_mask, col0, valid_cols, column_amax, Q, SCALE, QT, rows,
                      k, stride_scale_row, stride_scale_col, scale_col_tiles,
                      BLOCK_ROWS: tl.constexpr, WIDTH: tl.constexpr, QUANT_BLOCK: tl.constexpr,
                      SCALE_KIND: tl.constexpr, SWIZZLED: tl.constexpr,
                      SCALE_WORDS: tl.constexpr, Q_ALIGN: tl.constexpr, QT_ALIGN: tl.constexpr,
                      STORES_BY_PTX: tl.constexpr):
    """The rowwise blocks of a [BLOCK_ROWS, WIDTH] tile of y (with their scales), and the
    tile's columnwise blocks (scales from ``column_amax``) stored transposed."""
    quantize_tile(y, rows_idx, row_mask, col0, valid_cols, Q, SCALE, SCALE, SCALE, k,
                  stride_scale_row, stride_scale_col, scale_col_tiles, BLOCK_ROWS, WIDTH,
                  QUANT_BLOCK, SCALE_KIND, SWIZZLED, SCALE_WORDS, False, Q_ALIGN, STORES_BY_PTX)
    store_columnwise(y, rows_idx, row_mask, col0, valid_cols, column_amax, QT, rows, WIDTH,
                     SCALE_KIND, QT_ALIGN)


@triton.jit(do_not_specialize=RUNTIME_INTS + ["token_blocks"])
def quantized_forward_columnwise_kernel(
    X, GATE, W, Q, SCALE, QT, SCALE_T, RSTD,
    rows, size1, size2,
    stride_x0, stride_x1, stride_x2,
    stride_gate0, stride_gate1, stride_gate2,
    k, stride_scale_row, stride_scale_col, scale_col_tiles, token_blocks,
    group_size, num_groups, eps,
    LEADING_DIMS: tl.constexpr, ROW_ALIGN: tl.constexpr,
    BLOCK_N: tl.constexpr, TAIL_N: tl.constexpr, GROUPS_PER_TILE: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, ZERO_CENTERED: tl.constexpr, ACTIVATION: tl.constexpr,
    NORM_BEFORE_GATE: tl.constexpr, ROUNDING: tl.constexpr, WEIGHT_PRODUCT_ROUNDED: tl.constexpr,
    QUANT_BLOCK: tl.constexpr, SCALE_KIND: tl.constexpr, SWIZZLED: tl.constexpr,
    SCALE_WORDS: tl.constexpr, ROUND_Y: tl.constexpr, STORE_RSTD: tl.constexpr,
    QT_ALIGN: tl.constexpr, STORES_BY_PTX: tl.constexpr,
):
    """Program ``pid`` owns tile ``pid % (num_groups // GROUPS_PER_TILE)`` (as in
    quantized_forward_kernel) of the QUANT_BLOCK tokens from ``pid // that * QUANT_BLOCK``.
    Writes Q and SCALE as quantized_forward_kernel, and QT [k, rows] with SCALE_T [k,
    token_blocks]."""
    # Head + tail tiles take the unfused path (quantize.launch.fused_kernel_tiling).
    tl.static_assert(TAIL_N == 0)
    eps = fp32_argument(eps)
    pid = tl.program_id(0)
    tiles_per_row = num_groups // GROUPS_PER_TILE
    tile = pid % tiles_per_row
    token_block = pid // tiles_per_row
    first_group = tile * GROUPS_PER_TILE
    tile_offset = first_group.to(tl.int64) * group_size
    WIDTH: tl.constexpr = BLOCK_N * GROUPS_PER_TILE
    valid = group_size * GROUPS_PER_TILE
    rows_idx = token_block.to(tl.int64) * QUANT_BLOCK + tl.arange(0, QUANT_BLOCK)
    row_mask = rows_idx < rows
    y, _, rstd = tile_outputs(
        X, GATE, W, rows_idx, row_mask, tile_offset, size1, size2, stride_x0, stride_x1,
        stride_x2, stride_gate0, stride_gate1, stride_gate2, group_size, eps, LEADING_DIMS,
        ROW_ALIGN, QUANT_BLOCK, BLOCK_N, TAIL_N, GROUPS_PER_TILE, HAS_WEIGHT, ZERO_CENTERED,
        ACTIVATION, NORM_BEFORE_GATE, ROUNDING, WEIGHT_PRODUCT_ROUNDED, ROUND_Y)
    amax = column_maxima(y, rows_idx, row_mask, valid, WIDTH)
    store_column_scales(amax, tile_offset, valid, SCALE_T, token_blocks, token_block, WIDTH,
                        SCALE_KIND)
    store_both_copies(y, rows_idx, row_mask, tile_offset, valid, amax, Q, SCALE, QT, rows, k,
                      stride_scale_row, stride_scale_col, scale_col_tiles, QUANT_BLOCK, WIDTH,
                      QUANT_BLOCK, SCALE_KIND, SWIZZLED, SCALE_WORDS, ROW_ALIGN, QT_ALIGN,
                      STORES_BY_PTX)
    if STORE_RSTD:
        if GROUPS_PER_TILE == 1:
            tl.store(RSTD + rows_idx * num_groups + first_group, rstd, mask=row_mask)
        else:
            group_idx = first_group + tl.arange(0, GROUPS_PER_TILE)
            tl.store(RSTD + rows_idx[:, None] * num_groups + group_idx[None, :], rstd,
                     mask=row_mask[:, None])


@triton.jit(do_not_specialize=["rows", "token_blocks"])
def quantize_columnwise_kernel(
    Y, Q, SCALE, QT, SCALE_T, rows, k, stride_scale_row, stride_scale_col, scale_col_tiles,
    token_blocks,
    WIDTH: tl.constexpr, QUANT_BLOCK: tl.constexpr, SCALE_KIND: tl.constexpr,
    SWIZZLED: tl.constexpr, SCALE_WORDS: tl.constexpr, QT_ALIGN: tl.constexpr,
    STORES_BY_PTX: tl.constexpr,
):
    """Both copies of a contiguous [rows, k] y (k a multiple of QUANT_BLOCK): program ``pid``
    owns columns [pid % tiles * WIDTH, +WIDTH) of the QUANT_BLOCK tokens from
    ``pid // tiles * QUANT_BLOCK``. Writes Q and SCALE (rowwise blocks along k), QT [k, rows]
    and SCALE_T [k, token_blocks], as quantized_forward_columnwise_kernel does."""
    pid = tl.program_id(0)
    tiles_per_row = tl.cdiv(k, WIDTH)
    col0 = (pid % tiles_per_row).to(tl.int64) * WIDTH
    token_block = pid // tiles_per_row
    rows_idx = token_block.to(tl.int64) * QUANT_BLOCK + tl.arange(0, QUANT_BLOCK)
    row_mask = rows_idx < rows
    valid = k - col0
    cols = tl.arange(0, WIDTH)
    mask = row_mask[:, None] & (cols < valid)[None, :]
    y = tl.load(Y + rows_idx[:, None] * k + col0 + cols[None, :], mask=mask,
                other=0.0).to(tl.float32)
    amax = column_maxima(y, rows_idx, row_mask, valid, WIDTH)
    store_column_scales(amax, col0, valid, SCALE_T, token_blocks, token_block, WIDTH,
                        SCALE_KIND)
    # k is a multiple of the block (32 or 128 columns): Q's rows start on 16 bytes.
    store_both_copies(y, rows_idx, row_mask, col0, valid, amax, Q, SCALE, QT, rows, k,
                      stride_scale_row, stride_scale_col, scale_col_tiles, QUANT_BLOCK, WIDTH,
                      QUANT_BLOCK, SCALE_KIND, SWIZZLED, SCALE_WORDS, 16, QT_ALIGN,
                      STORES_BY_PTX)
