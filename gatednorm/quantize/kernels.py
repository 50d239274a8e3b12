"""Triton kernels of the quantized forward: the op's forward tile with an FP8 epilogue.

The tile math is the unquantized forward's (gatednorm.kernels.forward / pointwise: same
helpers, same tile rows, width and warps for the group size), so y, rounded to x's dtype, has
the op's bits; the epilogue cuts the tile of y into quantization blocks, takes each block's
amax, and stores E4M3 data and the scales. Where the quantization block nests in the group
(1x128 blocks of a 128- or 640-wide group) one program holds whole blocks of one group; where
groups nest in the block (64-wide groups, 128-wide blocks) a program holds the
GROUPS_PER_TILE groups of one block and reduces each group apart.

SCALE_KIND: 0 fp32 amax / 448, 1 the same rounded up to a power of two, 2 E8M0 (MXFP8),
3 a given per-tensor scale (copied to SCALE; the call's amax atomically maxed into AMAX), 4
per-tensor current scaling (amax read from AMAX, written by an AMAX_ONLY pass before).

STORES_BY_PTX (eager launches): a tile's per-row values (scales where a row has one stored
word, rstd) are stored by inline PTX from the reduction's layout (store_row_values), not by
tl.store, whose layout for them costs a shared-memory round trip and two barriers a tile.
torch.compile cannot see a store inside inline assembly: traced launches use tl.store.
"""

import os

import torch
import triton
import triton.language as tl

from gatednorm.kernels.forward import gated_tile, load_tail
from gatednorm.kernels.pointwise import (
    forward_output,
    fp32_argument,
    load_gamma,
    reciprocal,
    round_pairs,
    row_offsets,
    store_row_values,
)

# The interpreter (and a ROCm build) gets plain Triton; CUDA builds use what PTX's
# instructions guarantee (max.f32 ignoring NaN, an exact fma, cvt.rn.satfinite).
PORTABLE = os.environ.get("TRITON_INTERPRET", "0") == "1" or bool(torch.version.hip)

# Constants are written as literals inside the kernels: Triton rejects non-constexpr globals,
# and constexpr globals break Inductor's tracing of user kernels (pointwise.py). 448.0 is the
# largest finite E4M3 value, 3.4028234663852886e38 the largest finite fp32, 0x7F E4M3's NaN.
RUNTIME_INTS = [
    "rows", "size1", "size2",
    "stride_x0", "stride_x1", "stride_x2",
    "stride_gate0", "stride_gate1", "stride_gate2",
    "k", "stride_scale_row", "stride_scale_col", "scale_col_tiles",
    "num_groups",
]


@triton.jit
def fp32_scale(amax):
    """amax / 448, at least 2**-149 (1 where amax is 0 or infinite)."""
    # At least 2**-149, the fp32 with bits 1 (a subnormal literal would make the expression
    # fp64): amax is not negative, and neither is the quotient, whose bits then order as it.
    quotient = tl.math.div_rn(amax, 448.0).to(tl.int32, bitcast=True)
    scale = tl.maximum(quotient, 1).to(tl.float32, bitcast=True)
    return tl.where((amax > 0.0) & (amax <= 3.4028234663852886e38), scale, 1.0)


@triton.jit
def ceil_exponent(amax):
    """The biased exponent of the least power of two at or above amax / 448, for normal amax,
    without the division: amax = m * 2**(e - 127), m in [1, 2), is at most 448 * 2**(e - 135)
    = 1.75 * 2**(e - 127) exactly when m <= 1.75, that is when its fraction bits are at most
    0x600000, and adding 0x1FFFFF carries into the exponent exactly when they are above. The
    correctly rounded quotient has the same least power of two above it wherever it is
    normal (rounding is monotonic and keeps powers of two; the quotient's rounding error,
    0.875 of an ulp of amax at most, cannot cross 448 * 2**(e - 135), a multiple of that
    ulp). At least 1: where the quotient is subnormal (or tiny amax floors it at 2**-149), the
    least normal power of two, 2**-126. amax >= 0; zero, infinite and NaN amax are the
    callers' to replace."""
    return tl.maximum(((amax.to(tl.int32, bitcast=True) + 0x1FFFFF) >> 23) - 8, 1)


if PORTABLE:
    @triton.jit
    def block_magnitude(y, mask):
        """|y| with NaN and masked lanes as 0: the operand of a block's amax."""
        return tl.where(mask & (y == y), tl.abs(y), 0.0)

    @triton.jit
    def divide(y, divisor, negative_inverse, negative_prescale):
        """y / divisor, correctly rounded, y scaled as the divisor was (division_factors;
        exact): the interpreter's fma rounds twice, so no residual step here."""
        return tl.math.div_rn(y * -negative_prescale, divisor)

    @triton.jit
    def fp8_codes(values):
        """uint8 E4M3 codes of fp32 values: saturated to +-448, nearest even, NaN -> 0x7F."""
        return tl.where(values != values, 0x7F, e4m3_codes(values))

    @triton.jit
    def e4m3_codes(values):
        """E4M3 codes (uint8) of fp32 values, saturated to +-448, nearest even, in integer
        arithmetic: Triton 3.6's interpreter drops the carry when the mantissa rounds up
        (7.8 -> 4.0 instead of 8.0). NaN lanes are left to fp8_codes."""
        saturated = tl.minimum(tl.maximum(values, -448.0), 448.0)
        bits = saturated.to(tl.int32, bitcast=True)
        sign = ((bits >> 24) & 0x80).to(tl.int32)
        magnitude = bits & 0x7FFFFFFF
        # Normal results (|v| >= 2**-6): round the 23-bit mantissa to 3 bits, nearest even;
        # a carry moves into the exponent. 120 << 3 rebiases the exponent from 127 to 7.
        normal = ((magnitude + 0x7FFFF + ((magnitude >> 20) & 1)) >> 20) - (120 << 3)
        # Subnormal results: multiples of 2**-9, rounded to nearest even by the fp32 add.
        scaled = tl.abs(saturated) * 512.0
        subnormal = ((scaled + 8388608.0) - 8388608.0).to(tl.int32)
        codes = tl.where(magnitude < 0x3C800000, subnormal, normal)
        return (codes | sign).to(tl.uint8)
else:
    @triton.jit
    def block_magnitude(y, mask):
        """|y|, the operand of a block's amax. The hardware's max (max.f32, which tl.max
        lowers to) returns the other operand where one is NaN, so NaN lanes drop out of the
        amax without a select; masked lanes hold 0 (or NaN: a zero row with eps = 0)."""
        return tl.abs(y)

    @triton.jit
    def divide(y, divisor, negative_inverse, negative_prescale):
        """y / divisor, correctly rounded: the quotient div.rn gives, in four instructions
        and a clamp instead of div.rn's nine and a branch an element. The factors are per
        block (division_factors): ``negative_inverse`` is -1 / divisor refined as div.rn
        refines it, ``negative_prescale`` -1 or -2**64, already applied to ``divisor``.

        The steps are div.rn's fast path with the reciprocal hoisted out of the elements: a
        quotient within an ulp, its residual exact in one fma, one correction. div.rn takes
        its slow path only where an operand is subnormal or their exponents are far apart;
        here the divisor lies in [2**-64, 2**64] and, wherever the quotient is large enough
        to reach an E4M3 code (2**-10), y is normal and within 2**9 of the divisor. Working
        with negated y keeps the sign of zero (an fma whose terms cancel gives +0): the
        quotient of -0 is -0. Infinite y (its block's scale is 1) is clamped to the largest
        finite value, which saturates to the same code; NaN passes the clamp."""
        negated = tl.clamp(y, -3.4028234663852886e38, 3.4028234663852886e38,
                           propagate_nan=tl.PropagateNan.ALL) * negative_prescale
        quotient = negated * negative_inverse
        residual = tl.fma(quotient, divisor, negated)  # quotient * divisor - y, exact
        return tl.fma(residual, negative_inverse, quotient)

    @triton.jit
    def fp8_codes(values):
        """uint8 E4M3 codes of fp32 values: saturated to +-448, nearest even, NaN -> 0x7F,
        by the hardware conversion (cvt.rn.satfinite). The values come out of arithmetic
        instructions, whose NaN results are the canonical 0x7FFFFFFF, which converts to
        0x7F: no select (tests/gpu/test_gpu_division.py checks NaN of either sign)."""
        return values.to(tl.float8e4nv).to(tl.uint8, bitcast=True)


@triton.jit
def swizzled_offsets(row, col, scale_col_tiles):
    """Offsets of the scales of rows ``row`` and block columns ``col`` (broadcast against each
    other) in cuBLAS's 128x4 tiles (row-major tile order, each tile [32][4][4]: row % 32,
    row % 128 // 32, column % 4)."""
    tile = (row // 128) * scale_col_tiles + col // 4
    return tile * 512 + (row % 32) * 16 + ((row % 128) // 32) * 4 + col % 4


@triton.jit
def swizzled_word_offsets(row, word, scale_col_tiles):
    """Offsets, in 32-bit words, of the swizzled layout's scale words of rows ``row`` and word
    columns ``word`` (broadcast): word ``w`` of a row holds its scale columns 4w..4w+3, which
    swizzled_offsets puts in four adjacent bytes of one 128x4 tile."""
    tile = (row // 128) * scale_col_tiles + word
    return tile * 128 + (row % 32) * 4 + (row % 128) // 32


@triton.jit
def scale_offsets(row, col, stride_scale_row, stride_scale_col, scale_col_tiles,
                  SWIZZLED: tl.constexpr, SCALE_WORDS: tl.constexpr):
    """Offsets of the stored scales (words where SCALE_WORDS) of rows ``row`` and stored
    columns ``col``, broadcast against each other, in the plain or swizzled layout."""
    if SWIZZLED and SCALE_WORDS:
        offsets = swizzled_word_offsets(row, col, scale_col_tiles)
    elif SWIZZLED:
        offsets = swizzled_offsets(row, col, scale_col_tiles)
    else:
        offsets = row * stride_scale_row + col * stride_scale_col
    return offsets


@triton.jit
def scale_words(stored, BLOCK_ROWS: tl.constexpr, BLOCKS: tl.constexpr):
    """[BLOCK_ROWS, BLOCKS // 4] int32 words of [BLOCK_ROWS, BLOCKS] E8M0 exponents ([BLOCK_ROWS]
    for four blocks), four consecutive blocks a word, the first in the lowest byte
    (little-endian: the bytes' order in memory)."""
    tl.static_assert(BLOCKS % 4 == 0)
    # The fields are disjoint: their sum is their bitwise or (a sign bit set by the shift
    # of the fourth byte included).
    if BLOCKS == 4:
        words = tl.sum(stored.to(tl.int32) << (tl.arange(0, 4) * 8)[None, :], axis=1)
    else:
        shifts = (tl.arange(0, 4) * 8)[None, None, :]
        grouped = tl.reshape(stored.to(tl.int32), [BLOCK_ROWS, BLOCKS // 4, 4])
        words = tl.sum(grouped << shifts, axis=2)
    return words


@triton.jit
def division_factors(scale):
    """(divisor, negative_inverse, negative_prescale) of positive fp32 scales for
    :func:`divide`. Scales below 2**-64 (maxima below 448 * 2**-64) are scaled by 2**64,
    and y with them, exactly. The inverse is div.rn's: the approximate reciprocal and one
    Newton step."""
    prescale = tl.where(scale < 5.421010862427522e-20, 1.8446744073709552e19, 1.0)
    divisor = scale * prescale
    approximate = reciprocal(divisor)
    inverse = tl.fma(approximate, tl.fma(-divisor, approximate, 1.0), approximate)
    return divisor, -inverse, -prescale


@triton.jit
def divide_by_tensor_scale(y, scale):
    """y / scale correctly rounded, for one scale of the whole tensor. A given scale may be
    anything (zero, negative, huge): :func:`divide` where it lies in [2**-64, 2**64], div.rn
    otherwise (a branch that whole programs take)."""
    if (scale >= 5.421010862427522e-20) & (scale <= 1.8446744073709552e19):
        divisor, negative_inverse, negative_prescale = division_factors(scale)
        values = divide(y, divisor, negative_inverse, negative_prescale)
    else:
        values = tl.math.div_rn(y, scale)
    return values


@triton.jit
def block_scale(amax, SCALE_KIND: tl.constexpr):
    """(stored scale, divisor, multiplier, prescale) of blocks with maxima ``amax`` (any
    shape), for :func:`apply_scale`. Scales that are powers of two multiply y by their exact
    reciprocal, one rounding as the division's: E8M0 (2) stores the exponent e and multiplies
    by 2**(127 - e) (2**-127, subnormal, for e = 254); power-of-two fp32 scales (1) lie in
    [2**-126, 2**120] (ceil_exponent), whose reciprocals are normal. Divisor and prescale are
    then unused. Other fp32 scales (0) divide: the last three are :func:`division_factors`."""
    if SCALE_KIND == 2:
        # The quotient's exponent rounded up, at most 254: 1 for a subnormal quotient, 0 where
        # it rounds to 0 (amax <= 448 * 2**-150 = 7 * 2**-144, the fp32 with bits 224) and
        # for NaN (an all-NaN block), 254 for infinite amax. amax is not negative: its bits
        # order as it (compared as integers: a subnormal literal would be fp64).
        bits = amax.to(tl.int32, bitcast=True)
        exponent = tl.where(bits > 224, ceil_exponent(amax), 0)
        exponent = tl.where(bits == 0x7F800000, 254, exponent)
        exponent = tl.where(bits > 0x7F800000, 0, exponent)
        stored = exponent.to(tl.uint8)
        # 2**-127 is the fp32 with only mantissa bit 22 set.
        multiplier = tl.where(exponent == 254, 0x400000, (254 - exponent) << 23).to(
            tl.float32, bitcast=True)
        divisor = tl.full(amax.shape, 1.0, tl.float32)
        prescale = divisor
    elif SCALE_KIND == 1:
        # fp32_scale(amax) rounded up to a power of two, without its division: 1 where amax is
        # 0 or not finite.
        stored = tl.where((amax > 0.0) & (amax <= 3.4028234663852886e38),
                          ceil_exponent(amax) << 23,
                          0x3F800000).to(tl.float32, bitcast=True)
        # 2**(e - 127) -> 2**(127 - e): the biased exponent e becomes 254 - e.
        multiplier = ((254 << 23) - stored.to(tl.int32, bitcast=True)).to(tl.float32,
                                                                            bitcast=True)
        divisor = tl.full(amax.shape, 1.0, tl.float32)
        prescale = divisor
    else:
        stored = fp32_scale(amax)
        divisor, multiplier, prescale = division_factors(stored)
    return stored, divisor, multiplier, prescale


@triton.jit
def apply_scale(y, divisor, multiplier, prescale, SCALE_KIND: tl.constexpr):
    """y in units of its block's scale (block_scale's factors, broadcast to y)."""
    if SCALE_KIND == 1 or SCALE_KIND == 2:
        values = y * multiplier
    else:
        values = divide(y, divisor, multiplier, prescale)
    return values


@triton.jit
def raise_amax(AMAX, row_max):
    """AMAX = max(AMAX, every value of ``row_max``), the maxima of a tile's rows. Each row's
    maximum is raised from the lanes that hold the row (one warp): reducing the tile's rows
    first would cost a shared-memory round trip and a barrier a program. AMAX only grows, so
    a row at or below the value read cannot raise it: most rows skip the atomic, which every
    program would otherwise queue on one word."""
    address = AMAX + tl.zeros_like(row_max).to(tl.int32)
    tl.atomic_max(address, row_max, mask=row_max > tl.load(address))


@triton.jit
def store_block_scales(scale_values, rows_idx, row_mask, col0, valid_cols, SCALE,
                       stride_scale_row, stride_scale_col, scale_col_tiles,
                       BLOCK_ROWS: tl.constexpr, BLOCKS: tl.constexpr,
                       QUANT_BLOCK: tl.constexpr, SCALE_KIND: tl.constexpr,
                       SWIZZLED: tl.constexpr, SCALE_WORDS: tl.constexpr,
                       STORES_BY_PTX: tl.constexpr):
    """Store the scales of a tile's blocks: ``scale_values`` [BLOCK_ROWS, BLOCKS], or
    [BLOCK_ROWS] for one block a row, of the tile from column ``col0`` (``valid_cols`` of its
    columns in range).

    SCALE_WORDS (MXFP8, where ``col0`` and ``valid_cols`` are multiples of 128): SCALE is the
    scales' storage as int32 and its strides count words; each row's scales are stored four
    to a word. A row's four blocks of 128 columns share one 32-byte sector either way, but
    four byte stores to it cost the tile's store pipeline and L2 more than one word store.
    Where a row stores one 32-bit value (a 1x128 block or an MXFP8 word of a 128-wide tile),
    STORES_BY_PTX stores it from the reduction's layout."""
    if SCALE_WORDS:
        tl.static_assert(SCALE_KIND == 2)
        scale_values = scale_words(scale_values, BLOCK_ROWS, BLOCKS)
        STORED: tl.constexpr = BLOCKS // 4
        COLUMNS_STORED: tl.constexpr = 4 * QUANT_BLOCK
    else:
        STORED: tl.constexpr = BLOCKS
        COLUMNS_STORED: tl.constexpr = QUANT_BLOCK
    if STORED == 1 and (SCALE_WORDS or SCALE_KIND != 2):
        # [BLOCK_ROWS] 32-bit values; the tile's one stored column is in range.
        offsets = scale_offsets(rows_idx, col0 // COLUMNS_STORED, stride_scale_row,
                                stride_scale_col, scale_col_tiles, SWIZZLED, SCALE_WORDS)
        if STORES_BY_PTX:
            store_row_values(SCALE + offsets, scale_values, row_mask)
        else:
            tl.store(SCALE + offsets, scale_values, mask=row_mask)
    else:
        if STORED == 1:
            scale_values = scale_values[:, None]  # MXFP8 bytes of a 32-wide tile
        stored_idx = col0 // COLUMNS_STORED + tl.arange(0, STORED)  # [STORED]
        stored_mask = row_mask[:, None] & (tl.arange(0, STORED) * COLUMNS_STORED
                                           < valid_cols)[None, :]
        offsets = scale_offsets(rows_idx[:, None], stored_idx[None, :], stride_scale_row,
                                stride_scale_col, scale_col_tiles, SWIZZLED, SCALE_WORDS)
        tl.store(SCALE + offsets, scale_values, mask=stored_mask)


@triton.jit
def quantize_tile(y, rows_idx, row_mask, col0, valid_cols, Q, SCALE, TENSOR_SCALE, AMAX, k,
                  stride_scale_row, stride_scale_col, scale_col_tiles,
                  BLOCK_ROWS: tl.constexpr, WIDTH: tl.constexpr, QUANT_BLOCK: tl.constexpr,
                  SCALE_KIND: tl.constexpr, SWIZZLED: tl.constexpr, SCALE_WORDS: tl.constexpr,
                  AMAX_ONLY: tl.constexpr, Q_ALIGN: tl.constexpr, STORES_BY_PTX: tl.constexpr):
    """Quantize and store a [BLOCK_ROWS, WIDTH] fp32 tile of y whose first column is column
    ``col0`` of the [rows, k] output; columns at or past ``valid_cols`` are padding.

    Q_ALIGN: what ``rows * k + col0`` is a multiple of, stated rather than inferred. The
    layout of Q's store can become the tile's layout, and so fix the order of the fused
    kernels' sum of squares; an inferred alignment would differ between the eager launch (k
    not specialized) and Inductor's (k specialized on its value)."""
    cols = tl.arange(0, WIDTH)  # [WIDTH]
    mask = row_mask[:, None] & (cols < valid_cols)[None, :]  # [BLOCK_ROWS, WIDTH]
    magnitude = block_magnitude(y, mask)
    if AMAX_ONLY or SCALE_KIND == 3:
        row_max = tl.max(magnitude, axis=1)  # [BLOCK_ROWS]
    if AMAX_ONLY:
        raise_amax(AMAX, row_max)
    else:
        if SCALE_KIND >= 3:
            if SCALE_KIND == 3:
                scale = tl.load(TENSOR_SCALE)
            else:
                scale = fp32_scale(tl.load(AMAX))
            codes = fp8_codes(divide_by_tensor_scale(y, scale))
        else:
            BLOCKS: tl.constexpr = WIDTH // QUANT_BLOCK
            if BLOCKS == 1:
                # One block a tile row (GDN's 128-wide heads): no reshape, so no layout change.
                amax = tl.max(magnitude, axis=1)  # [BLOCK_ROWS]
                scale_values, divisor, multiplier, prescale = block_scale(amax, SCALE_KIND)
                values = apply_scale(y, divisor[:, None], multiplier[:, None],
                                     prescale[:, None], SCALE_KIND)
            else:
                amax = tl.max(tl.reshape(magnitude, [BLOCK_ROWS, BLOCKS, QUANT_BLOCK]), axis=2)
                blocks = tl.reshape(y, [BLOCK_ROWS, BLOCKS, QUANT_BLOCK])
                scale_values, divisor, multiplier, prescale = block_scale(amax, SCALE_KIND)
                values = tl.reshape(apply_scale(blocks, divisor[:, :, None], multiplier[:, :, None],
                                                prescale[:, :, None], SCALE_KIND),
                                    [BLOCK_ROWS, WIDTH])
            codes = fp8_codes(values)
            store_block_scales(scale_values, rows_idx, row_mask, col0, valid_cols, SCALE,
                               stride_scale_row, stride_scale_col, scale_col_tiles, BLOCK_ROWS,
                               BLOCKS, QUANT_BLOCK, SCALE_KIND, SWIZZLED, SCALE_WORDS,
                               STORES_BY_PTX)
        q_rows = tl.multiple_of(rows_idx * k + col0, Q_ALIGN)  # [BLOCK_ROWS]
        tl.store(Q + q_rows[:, None] + cols[None, :], codes, mask=mask)
        if SCALE_KIND == 3:
            # After the stores, which then need not wait for the amax word's round trip.
            raise_amax(AMAX, row_max)


@triton.jit
def store_tensor_scale(SCALE, TENSOR_SCALE, AMAX, SCALE_KIND: tl.constexpr,
                       AMAX_ONLY: tl.constexpr):
    """Per-tensor scaling: program 0 of the quantizing pass stores the scale it used (the given
    one, which the output keeps as of this call, or current scaling's)."""
    if SCALE_KIND >= 3 and not AMAX_ONLY:
        if tl.program_id(0) == 0:
            if SCALE_KIND == 3:
                tl.store(SCALE, tl.load(TENSOR_SCALE))
            else:
                tl.store(SCALE, fp32_scale(tl.load(AMAX)))


@triton.jit
def finish_y(y, X_DTYPE: tl.constexpr, ROUND_Y: tl.constexpr):
    """The value quantized: y rounded to x's dtype (the op's output), or its fp32 value."""
    if ROUND_Y:
        y = round_pairs(y, X_DTYPE)
    return y


@triton.jit
def tile_outputs(X, GATE, W, rows_idx, row_mask, tile_offset, size1, size2,
                 stride_x0, stride_x1, stride_x2, stride_gate0, stride_gate1, stride_gate2,
                 group_size, eps, LEADING_DIMS: tl.constexpr, ROW_ALIGN: tl.constexpr,
                 BLOCK_ROWS: tl.constexpr, BLOCK_N: tl.constexpr, TAIL_N: tl.constexpr,
                 GROUPS_PER_TILE: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                 ZERO_CENTERED: tl.constexpr, ACTIVATION: tl.constexpr,
                 NORM_BEFORE_GATE: tl.constexpr, ROUNDING: tl.constexpr,
                 WEIGHT_PRODUCT_ROUNDED: tl.constexpr, ROUND_Y: tl.constexpr):
    """(y, tail_y, rstd) of rows ``rows_idx`` of one tile, the op's forward math: y
    [BLOCK_ROWS, BLOCK_N * GROUPS_PER_TILE] from column ``tile_offset``, tail_y [BLOCK_ROWS,
    TAIL_N] after it (y itself when TAIL_N = 0), rstd [BLOCK_ROWS] or [BLOCK_ROWS,
    GROUPS_PER_TILE]. y is rounded to x's dtype when ROUND_Y."""
    WIDTH: tl.constexpr = BLOCK_N * GROUPS_PER_TILE
    cols = tl.arange(0, WIDTH)  # [WIDTH]
    col_mask = cols < group_size * GROUPS_PER_TILE
    mask = row_mask[:, None] & col_mask[None, :]  # [BLOCK_ROWS, WIDTH]
    x_rows = row_offsets(rows_idx, size1, size2, stride_x0, stride_x1, stride_x2, tile_offset,
                         LEADING_DIMS, ROW_ALIGN)
    g_rows = row_offsets(rows_idx, size1, size2, stride_gate0, stride_gate1, stride_gate2,
                         tile_offset, LEADING_DIMS, ROW_ALIGN)
    x = tl.load(X + x_rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    g = tl.load(GATE + g_rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    gamma = load_gamma(W, tile_offset + cols, col_mask, HAS_WEIGHT, ZERO_CENTERED)  # [WIDTH]
    act, h = gated_tile(x, g, X.dtype.element_ty, ACTIVATION, NORM_BEFORE_GATE, ROUNDING)

    if GROUPS_PER_TILE == 1:
        sum_square = tl.sum(h * h, axis=1)  # [BLOCK_ROWS]
        if TAIL_N > 0:
            tail_cols, tail_mask, tail_act, tail_h, tail_gamma = load_tail(
                X, GATE, W, x_rows, g_rows, row_mask, tile_offset, group_size, BLOCK_N,
                TAIL_N, HAS_WEIGHT, ZERO_CENTERED, ACTIVATION, NORM_BEFORE_GATE, ROUNDING)
            sum_square += tl.sum(tail_h * tail_h, axis=1)
        rstd = 1.0 / tl.sqrt(sum_square / group_size + eps)  # [BLOCK_ROWS]
        h_hat = h * rstd[:, None]
    else:
        grouped = tl.reshape(h, [BLOCK_ROWS, GROUPS_PER_TILE, BLOCK_N])
        sum_square = tl.sum(grouped * grouped, axis=2)  # [BLOCK_ROWS, GROUPS_PER_TILE]
        rstd = 1.0 / tl.sqrt(sum_square / group_size + eps)
        h_hat = tl.reshape(grouped * rstd[:, :, None], [BLOCK_ROWS, WIDTH])
    y = forward_output(h_hat, act, gamma, X.dtype.element_ty, WEIGHT_PRODUCT_ROUNDED,
                       HAS_WEIGHT, NORM_BEFORE_GATE, ROUNDING)
    y = finish_y(y, X.dtype.element_ty, ROUND_Y)
    tail_y = y
    if TAIL_N > 0:
        tail_y = forward_output(tail_h * rstd[:, None], tail_act, tail_gamma,
                                X.dtype.element_ty, WEIGHT_PRODUCT_ROUNDED, HAS_WEIGHT,
                                NORM_BEFORE_GATE, ROUNDING)
        tail_y = finish_y(tail_y, X.dtype.element_ty, ROUND_Y)
    return y, tail_y, rstd


@triton.jit(do_not_specialize=RUNTIME_INTS)
def quantized_forward_kernel(
    X, GATE, W, Q, SCALE, RSTD, TENSOR_SCALE, AMAX,
    rows, size1, size2,
    stride_x0, stride_x1, stride_x2,
    stride_gate0, stride_gate1, stride_gate2,
    k, stride_scale_row, stride_scale_col, scale_col_tiles,
    group_size, num_groups, eps,
    LEADING_DIMS: tl.constexpr, ROW_ALIGN: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_N: tl.constexpr, TAIL_N: tl.constexpr,
    GROUPS_PER_TILE: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, ZERO_CENTERED: tl.constexpr, ACTIVATION: tl.constexpr,
    NORM_BEFORE_GATE: tl.constexpr, ROUNDING: tl.constexpr, WEIGHT_PRODUCT_ROUNDED: tl.constexpr,
    QUANT_BLOCK: tl.constexpr, SCALE_KIND: tl.constexpr, SWIZZLED: tl.constexpr,
    SCALE_WORDS: tl.constexpr, ROUND_Y: tl.constexpr, STORE_RSTD: tl.constexpr,
    AMAX_ONLY: tl.constexpr, STORES_BY_PTX: tl.constexpr,
):
    """Program ``pid`` owns tile ``pid % (num_groups // GROUPS_PER_TILE)`` of rows
    ``[pid // that * BLOCK_ROWS, +BLOCK_ROWS)``: one group ([BLOCK_ROWS, BLOCK_N] plus a
    [BLOCK_ROWS, TAIL_N] tail), or GROUPS_PER_TILE whole groups of BLOCK_N side by side.
    Output Q is the contiguous [rows, k] E4M3 tensor (as uint8 codes)."""
    eps = fp32_argument(eps)
    pid = tl.program_id(0)
    tiles_per_row = num_groups // GROUPS_PER_TILE
    tile = pid % tiles_per_row
    row_block = pid // tiles_per_row
    rows_idx = row_block.to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)  # [BLOCK_ROWS]
    row_mask = rows_idx < rows
    first_group = tile * GROUPS_PER_TILE
    tile_offset = first_group.to(tl.int64) * group_size
    WIDTH: tl.constexpr = BLOCK_N * GROUPS_PER_TILE
    y, tail_y, rstd = tile_outputs(
        X, GATE, W, rows_idx, row_mask, tile_offset, size1, size2, stride_x0, stride_x1,
        stride_x2, stride_gate0, stride_gate1, stride_gate2, group_size, eps, LEADING_DIMS,
        ROW_ALIGN, BLOCK_ROWS, BLOCK_N, TAIL_N, GROUPS_PER_TILE, HAS_WEIGHT, ZERO_CENTERED,
        ACTIVATION, NORM_BEFORE_GATE, ROUNDING, WEIGHT_PRODUCT_ROUNDED, ROUND_Y)
    STORES_RSTD: tl.constexpr = STORE_RSTD and not AMAX_ONLY
    RSTD_BY_PTX: tl.constexpr = STORES_RSTD and STORES_BY_PTX and GROUPS_PER_TILE == 1
    if RSTD_BY_PTX:
        store_row_values(RSTD + rows_idx * num_groups + first_group, rstd, row_mask)
    quantize_tile(y, rows_idx, row_mask, tile_offset, group_size * GROUPS_PER_TILE, Q, SCALE,
                  TENSOR_SCALE, AMAX, k, stride_scale_row, stride_scale_col, scale_col_tiles,
                  BLOCK_ROWS, WIDTH, QUANT_BLOCK, SCALE_KIND, SWIZZLED, SCALE_WORDS, AMAX_ONLY,
                  ROW_ALIGN, STORES_BY_PTX)
    if TAIL_N > 0:
        quantize_tile(tail_y, rows_idx, row_mask, tile_offset + BLOCK_N, group_size - BLOCK_N,
                      Q, SCALE, TENSOR_SCALE, AMAX, k, stride_scale_row, stride_scale_col,
                      scale_col_tiles, BLOCK_ROWS, TAIL_N, QUANT_BLOCK, SCALE_KIND, SWIZZLED,
                      SCALE_WORDS, AMAX_ONLY, ROW_ALIGN, STORES_BY_PTX)
    store_tensor_scale(SCALE, TENSOR_SCALE, AMAX, SCALE_KIND, AMAX_ONLY)
    if STORES_RSTD and not RSTD_BY_PTX:
        if GROUPS_PER_TILE == 1:
            tl.store(RSTD + rows_idx * num_groups + first_group, rstd, mask=row_mask)
        else:
            group_idx = first_group + tl.arange(0, GROUPS_PER_TILE)  # [GROUPS_PER_TILE]
            tl.store(RSTD + rows_idx[:, None] * num_groups + group_idx[None, :], rstd,
                     mask=row_mask[:, None])


@triton.jit(do_not_specialize=["rows", "k", "stride_y", "stride_scale_row", "stride_scale_col",
                               "scale_col_tiles"])
def quantize_kernel(
    Y, Q, SCALE, TENSOR_SCALE, AMAX,
    rows, k, stride_y, stride_scale_row, stride_scale_col, scale_col_tiles,
    BLOCK_ROWS: tl.constexpr, WIDTH: tl.constexpr, QUANT_BLOCK: tl.constexpr,
    SCALE_KIND: tl.constexpr, SWIZZLED: tl.constexpr, SCALE_WORDS: tl.constexpr,
    AMAX_ONLY: tl.constexpr, STORES_BY_PTX: tl.constexpr,
):
    """Quantize a [rows, k] y (the unfused path for shapes whose groups and blocks do not
    nest): program ``pid`` owns columns [pid % tiles * WIDTH, +WIDTH) of BLOCK_ROWS rows."""
    pid = tl.program_id(0)
    tiles_per_row = tl.cdiv(k, WIDTH)
    col0 = (pid % tiles_per_row).to(tl.int64) * WIDTH
    rows_idx = (pid // tiles_per_row).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_mask = rows_idx < rows
    cols = tl.arange(0, WIDTH)
    mask = row_mask[:, None] & (col0 + cols < k)[None, :]
    y = tl.load(Y + rows_idx[:, None] * stride_y + col0 + cols[None, :], mask=mask,
                other=0.0).to(tl.float32)
    quantize_tile(y, rows_idx, row_mask, col0, k - col0, Q, SCALE, TENSOR_SCALE, AMAX, k,
                  stride_scale_row, stride_scale_col, scale_col_tiles, BLOCK_ROWS, WIDTH,
                  QUANT_BLOCK, SCALE_KIND, SWIZZLED, SCALE_WORDS, AMAX_ONLY, 1, STORES_BY_PTX)
    store_tensor_scale(SCALE, TENSOR_SCALE, AMAX, SCALE_KIND, AMAX_ONLY)
