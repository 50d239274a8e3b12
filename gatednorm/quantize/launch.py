"""Host side of the quantized forward: allocate, pick the tiling, launch.

Inputs arrive validated with a unit-stride last dim. The tiling is the unquantized forward's
one-tile configuration for the group size (config.forward_config: rows, width, tail, warps),
so the sum of squares is reduced in the same layout and y has the op's bits. Shapes where
neither the quantization block nests in the group nor the group in the block, and groups
wider than a register tile, take the unfused path: the op's forward, then quantize_kernel
(rowwise) or quantize_columnwise_kernel (both copies).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
from torch.library import wrap_triton

from gatednorm.kernels import launch as _op_launch
from gatednorm.kernels.config import forward_config
from gatednorm.kernels.layout import row_layout
from gatednorm.kernels.plan import few_rows_forward_config
from gatednorm.quantize.columnwise import (
    quantize_columnwise_kernel,
    quantized_forward_columnwise_kernel,
)
from gatednorm.quantize.formats import (
    FP8_DTYPE,
    SWIZZLE_COLS,
    Float8Format,
    allocate_columnwise,
    allocate_scales,
)
from gatednorm.quantize.kernels import quantize_kernel, quantized_forward_kernel

# SCALE_KIND values of the kernels.
BLOCK_FP32, BLOCK_POWER_OF_TWO, MXFP8_E8M0, TENSOR_GIVEN, TENSOR_CURRENT = range(5)
# The unfused path's quantize tile: rows x columns a program.
QUANTIZE_TILE_ROWS = 16
QUANTIZE_TILE_COLUMNS = 128
QUANTIZE_TILE_WARPS = 4
# The fused columnwise kernel's tile is at most this wide. The columnwise kernels hold at most
# COLUMNWISE_ELEMENTS_PER_THREAD values of y a thread, over at most COLUMNWISE_MAX_WARPS warps,
# and cap their registers so that COLUMNWISE_PROGRAMS_PER_SM programs fit an SM: left to
# itself, the compiler gives a [128, 128] tile on 8 warps more than 128 registers a thread,
# room for one program an SM, whose loads and stores then have no other program's to overlap.
COLUMNWISE_MAX_WIDTH = 128
COLUMNWISE_ELEMENTS_PER_THREAD = 64
COLUMNWISE_MAX_WARPS = 16
COLUMNWISE_PROGRAMS_PER_SM = 2
REGISTERS_PER_SM = 65536  # 32-bit registers of an SM, sm_80 to sm_90
MAX_REGISTERS_PER_THREAD = 255
# Register caps of the fused rowwise kernel on GDN's [16, 128] tile (4 warps), by SCALE_KIND.
# Left to choose, ptxas fits the UE8M0 and MXFP8 epilogues of that tile into fewer registers
# by issuing part of the tile's loads (the second row block of x, the gate) only after the
# first row reduction: a program then waits on memory two or three times instead of once. At
# 56 every load goes out first (benchmarks/instruction_count.py counts the loads issued
# before the first shuffle). fp32 scales issue them first at ptxas's own choice, which is
# faster for them than the cap.
ROWWISE_TILE_MAXNREG = {BLOCK_POWER_OF_TWO: 56, MXFP8_E8M0: 56}


def scale_kind(fmt: Float8Format) -> int:
    if fmt.scaling == "tensor":
        return TENSOR_CURRENT if fmt.scale is None else TENSOR_GIVEN
    if fmt.scaling == "mxfp8":
        return MXFP8_E8M0
    return BLOCK_POWER_OF_TWO if fmt.power_of_two_scales else BLOCK_FP32


@dataclass(frozen=True)
class Tiling:
    """How the fused kernel covers a group: ``groups_per_tile`` groups of ``block_n`` (+
    ``tail_n``) columns, ``block_rows`` rows, ``num_warps`` warps, loads at most
    ``max_vector_elements`` wide (0: as the rows' alignment allows), all as the op's forward."""

    block_rows: int
    block_n: int
    tail_n: int
    groups_per_tile: int
    num_warps: int
    max_vector_elements: int


def fused_tiling(group_size: int, num_groups: int, quant_block: int) -> Tiling | None:
    """The fused kernel's tiling, or None for the unfused path. ``quant_block`` 0: per-tensor."""
    config = forward_config(group_size)
    if config.long_row:
        return None
    whole = Tiling(config.block_rows, config.block_n, config.tail_n, 1, config.num_warps,
                   config.max_vector_elements)
    if quant_block == 0:
        return whole
    if group_size % quant_block == 0:
        # Blocks nest in the group: every tile (head and tail) must hold whole blocks.
        if config.block_n % quant_block == 0 and config.tail_n % quant_block == 0:
            return whole
        return None
    if (quant_block % group_size == 0 and config.block_n == group_size
            and num_groups % (quant_block // group_size) == 0):
        return Tiling(config.block_rows, config.block_n, 0, quant_block // group_size,
                      config.num_warps, config.max_vector_elements)
    return None


def fused_kernel_tiling(group_size: int, num_groups: int, fmt: Float8Format) -> Tiling | None:
    """The tiling of the kernel that writes every output ``fmt`` asks for, or None when the
    unfused path writes them. The columnwise kernel holds a whole token block of the tile in
    registers (columnwise_launch), which fits tiles up to 128 wide; wider groups (Mamba2's
    640, Nemotron-H's 1024) take the unfused path for their columnwise copies, and so do
    head + tail tiles (D = 96), whose lanes the compiler lays out otherwise at that height."""
    tiling = fused_tiling(group_size, num_groups, fmt.block_size)
    if tiling is not None and fmt.columnwise and (
            tiling.tail_n or tiling.block_n * tiling.groups_per_tile > COLUMNWISE_MAX_WIDTH):
        return None
    return tiling


def columnwise_launch(quant_block: int, width: int, least: int = 4) -> dict:
    """``num_warps`` (and ``maxnreg``) of a columnwise kernel's [quant_block, width] tile.

    Warps: ``least`` (the fused kernel passes the op's tile's warps), or more, up to
    COLUMNWISE_MAX_WARPS, to hold at most COLUMNWISE_ELEMENTS_PER_THREAD values of y a
    thread. Warps stack along the rows, so a row's lanes, and its sum's order, stay the op's.
    Registers: capped where the tile's threads could otherwise take more than an SM's share
    of COLUMNWISE_PROGRAMS_PER_SM programs (a CUDA compile option; registers do not change
    the arithmetic)."""
    wanted = quant_block * width // (32 * COLUMNWISE_ELEMENTS_PER_THREAD)
    warps = max(least, min(COLUMNWISE_MAX_WARPS, wanted))
    cap = REGISTERS_PER_SM // (COLUMNWISE_PROGRAMS_PER_SM * 32 * warps) // 8 * 8
    if cap < MAX_REGISTERS_PER_THREAD and not torch.version.hip:
        return dict(num_warps=warps, maxnreg=cap)
    return dict(num_warps=warps)


def rowwise_launch(tiling: Tiling, kind: int) -> dict:
    """The fused rowwise kernel's register cap for ``tiling`` and SCALE_KIND ``kind`` (a
    launch option; registers do not change the arithmetic): ROWWISE_TILE_MAXNREG on the
    [16, 128] one-group tile, none elsewhere."""
    shape = (tiling.block_rows, tiling.block_n, tiling.tail_n, tiling.groups_per_tile,
             tiling.num_warps)
    cap = ROWWISE_TILE_MAXNREG.get(kind)
    if cap and shape == (16, 128, 0, 1, 4) and not torch.version.hip:
        return dict(maxnreg=cap)
    return {}


def transposed_alignment(rows, traceable: bool) -> int:
    """QT_ALIGN of the columnwise kernels: 16 where the token count (the transposed copy's
    row stride) is a multiple of 16 and known at launch; a traced launch's row count varies."""
    return 16 if not traceable and rows % 16 == 0 else 1


def few_rows_tiling(tiling: Tiling, group_size: int, rows, num_groups: int) -> Tiling:
    """``tiling``, or the op's one-warp decode tile where the op's forward takes it (few
    programs of a table tile up to 128 wide: decode sizes); same lanes and order, so y keeps
    its bits. Tiles of one group only."""
    if tiling.groups_per_tile != 1 or not isinstance(rows, int):
        return tiling
    table = forward_config(group_size)
    decode = few_rows_forward_config(table, rows, num_groups)
    if decode is table:
        return tiling
    return replace(tiling, block_rows=decode.block_rows, num_warps=decode.num_warps)


def stores_scale_words(fmt: Float8Format, *tile_columns: int) -> bool:
    """SCALE_WORDS of the kernels: whether MXFP8 scales go four to a 32-bit store. Where every
    tile's rowwise blocks start and end on 128 columns (``tile_columns``: the period of the
    tiles' starts and their valid widths), a row's four scales of a 128-column span are
    adjacent bytes of one aligned word in both layouts (row-major [tokens, K / 32] with K a
    multiple of 128, and cuBLAS's 128x4 tiles)."""
    return fmt.scaling == "mxfp8" and all(c % (4 * fmt.block_size) == 0 for c in tile_columns)


def _kernel_flags(fmt: Float8Format, kind: int, words: bool, traceable: bool) -> dict:
    # STORES_BY_PTX: torch.compile's mutation analysis cannot see inline PTX stores.
    return dict(QUANT_BLOCK=max(fmt.block_size, 1), SCALE_KIND=kind,
                SWIZZLED=fmt.scale_layout == "swizzled", SCALE_WORDS=words,
                STORES_BY_PTX=not traceable)


def _scale_arguments(scales: torch.Tensor, fmt: Float8Format, k: int, words: bool):
    """(the kernels' SCALE, its row stride, column stride, swizzle column tiles): MXFP8
    scales as their bytes, or as int32 words (strides in words) where ``words``."""
    if fmt.scaling == "tensor":
        return scales, 0, 0, 0
    if fmt.scaling != "mxfp8":
        return scales, scales.stride(0), scales.stride(1), 0
    storage = scales.view(torch.uint8)
    if words:
        storage = storage.view(torch.int32)
    if fmt.scale_layout == "swizzled":
        blocks = k // fmt.block_size
        return storage, 0, 0, -(-blocks // SWIZZLE_COLS)
    return storage, storage.stride(0), storage.stride(1), 0


def allocate_outputs(x, tensor_scale, group_size: int, fmt: Float8Format, store_rstd: bool,
                     amax_in_place: bool = False):
    """Empty (data, scales, rstd, amax, columnwise data, columnwise scales) of
    :func:`quantized_forward` (also its fake implementation): amax zeroed (the kernels max
    into it), or empty where the call maxes into the caller's buffer (``amax_in_place``)."""
    k = x.shape[-1]
    rows = x.numel() // k if k else 0
    device = x.device
    data = torch.empty((rows, k), dtype=FP8_DTYPE, device=device)
    scales = allocate_scales(fmt, rows, k, device)
    rstd = torch.empty((*x.shape[:-1], k // group_size) if store_rstd else (0,),
                       dtype=torch.float32, device=device)
    amax = torch.zeros((1,) if fmt.scaling == "tensor" and not amax_in_place else (0,),
                       dtype=torch.float32, device=device)
    return (data, scales, rstd, amax, *allocate_columnwise(fmt, rows, k, device))


@dataclass(frozen=True)
class FusedPlan:
    """A fused launch: ``kernel`` over ``grid`` with its constexprs ``meta`` (the rowwise
    kernel's without AMAX_ONLY, which varies by pass), the row layout's integer arguments,
    and x and the gate as launched (made contiguous where their layout needs it)."""

    kernel: object
    grid: tuple[int]
    meta: dict
    layout_args: tuple
    x: torch.Tensor
    gate: torch.Tensor


def fused_scale_words(fmt: Float8Format, tiling: Tiling, group_size: int) -> bool:
    """SCALE_WORDS of the fused kernels: tiles start every ``group_size * groups_per_tile``
    columns, a head + tail tile's tail after ``block_n``."""
    head = (tiling.block_n,) if tiling.tail_n else ()
    return stores_scale_words(fmt, group_size * tiling.groups_per_tile, *head)


def fused_plan(x, gate, weight, fmt: Float8Format, tiling: Tiling, *, group_size: int,
               zero_centered_gamma, activation, norm_before_gate, rounding, store_rstd: bool,
               traceable: bool) -> FusedPlan:
    """The fused kernel's launch for x, gate (x's shape) and weight (or None) on ``tiling``
    (:func:`fused_kernel_tiling`, adjusted for decode sizes)."""
    layout = row_layout([x, gate], group_size)
    if layout is None:
        x, gate = x.contiguous(), gate.contiguous()
        layout = row_layout([x, gate], group_size)
    num_tiles = x.shape[-1] // group_size // tiling.groups_per_tile
    layout_args = (layout.rows, layout.size1, layout.size2, *layout.strides[0],
                   *layout.strides[1])
    meta = dict(
        LEADING_DIMS=layout.leading_dims,
        ROW_ALIGN=min(layout.row_align, tiling.max_vector_elements or layout.row_align),
        BLOCK_ROWS=tiling.block_rows, BLOCK_N=tiling.block_n, TAIL_N=tiling.tail_n,
        GROUPS_PER_TILE=tiling.groups_per_tile,
        HAS_WEIGHT=weight is not None, ZERO_CENTERED=zero_centered_gamma,
        ACTIVATION=_op_launch.ACTIVATION_FLAG[activation],
        NORM_BEFORE_GATE=norm_before_gate, ROUNDING=_op_launch.ROUNDING_FLAG[rounding],
        WEIGHT_PRODUCT_ROUNDED=(weight is not None and weight.dtype == x.dtype
                                and x.dtype != torch.float32),
        ROUND_Y=fmt.quantize_rounded, STORE_RSTD=store_rstd,
        num_warps=tiling.num_warps,
        **_kernel_flags(fmt, scale_kind(fmt), fused_scale_words(fmt, tiling, group_size),
                        traceable))
    if not fmt.columnwise:
        meta.update(rowwise_launch(tiling, meta["SCALE_KIND"]))
        grid = (triton.cdiv(layout.rows, tiling.block_rows) * num_tiles,)
        return FusedPlan(quantized_forward_kernel, grid, meta, layout_args, x, gate)
    # The columnwise kernel's rows are a token block.
    del meta["BLOCK_ROWS"]
    width = tiling.block_n * tiling.groups_per_tile + tiling.tail_n
    meta.update(**columnwise_launch(fmt.block_size, width, tiling.num_warps),
                QT_ALIGN=transposed_alignment(layout.rows, traceable))
    grid = (triton.cdiv(layout.rows, fmt.block_size) * num_tiles,)
    return FusedPlan(quantized_forward_columnwise_kernel, grid, meta, layout_args, x, gate)


def quantized_forward(x, gate, weight, tensor_scale, *, eps, zero_centered_gamma, activation,
                      norm_before_gate, group_size, rounding, fmt: Float8Format,
                      store_rstd: bool, traceable: bool, amax_out=None):
    """(data [rows, K] E4M3, scales, rstd [..., K / group_size] fp32 or empty, amax [1] fp32
    or empty, columnwise data [K, rows] or empty, columnwise scales or empty) of the gated
    norm of x, quantized in ``fmt``. Delayed scaling with ``amax_out`` (fp32 [1]): the kernel
    maxes the call's amax into it in place (no launch of its own) and amax is empty. (Current
    scaling needs the call's own amax for its scale: the caller maxes it into its buffer.)"""
    assert amax_out is None or tensor_scale is not None, "amax_out: delayed scaling only"
    data, scales, rstd, amax, col_data, col_scales = allocate_outputs(
        x, tensor_scale, group_size, fmt, store_rstd, amax_in_place=amax_out is not None)
    amax_target = amax if amax_out is None else amax_out  # what the kernels max into
    k = x.shape[-1]
    rows = data.shape[0]
    num_groups = k // group_size
    if rows == 0:
        if fmt.scaling == "tensor":  # what the kernels' program 0 would have stored
            if tensor_scale is None:
                scales.fill_(1.0)
            else:
                scales.copy_(tensor_scale.reshape(1))
        return data, scales, rstd, amax, col_data, col_scales
    kind = scale_kind(fmt)
    tiling = fused_kernel_tiling(group_size, num_groups, fmt)
    if tiling is not None and not fmt.columnwise:
        tiling = few_rows_tiling(tiling, group_size, rows, num_groups)
    run = (lambda kernel: wrap_triton(kernel)) if traceable else (lambda kernel: kernel)
    scale_arg = tensor_scale if tensor_scale is not None else amax
    col_scale_out = (col_scales.view(torch.uint8) if fmt.columnwise and fmt.scaling == "mxfp8"
                     else col_scales)
    if tiling is None:
        # The unfused kernels' tiles are 128 columns wide, from column 0. The kernel of both
        # copies stores its scales a byte at a time: there the word's packing shuffles cost
        # more than the stores they save.
        words = not fmt.columnwise and stores_scale_words(fmt, k)
    else:
        words = fused_scale_words(fmt, tiling, group_size)
    scale_out, *geometry = _scale_arguments(scales, fmt, k, words)
    if tiling is None:
        y, op_rstd = _op_launch.forward(
            x, gate, weight, eps=eps, zero_centered_gamma=zero_centered_gamma,
            activation=activation, norm_before_gate=norm_before_gate, group_size=group_size,
            rounding=rounding, traceable=traceable, store_rstd=store_rstd)
        if store_rstd:
            rstd = op_rstd
        y2d = y.reshape(rows, k)
        if fmt.columnwise:
            # Both copies from one read of y, a partial last token block masked.
            width = QUANTIZE_TILE_COLUMNS
            grid = (triton.cdiv(rows, fmt.block_size) * triton.cdiv(k, width),)
            run(quantize_columnwise_kernel)[grid](
                y2d, data.view(torch.uint8), scale_out, col_data.view(torch.uint8),
                col_scale_out, rows, k, *geometry, col_scales.shape[1], WIDTH=width,
                QT_ALIGN=transposed_alignment(rows, traceable),
                **columnwise_launch(fmt.block_size, width),
                **_kernel_flags(fmt, kind, words, traceable))
        else:
            grid = (triton.cdiv(rows, QUANTIZE_TILE_ROWS)
                    * triton.cdiv(k, QUANTIZE_TILE_COLUMNS),)
            passes = (True, False) if kind == TENSOR_CURRENT else (False,)
            for amax_only in passes:
                run(quantize_kernel)[grid](
                    y2d, data.view(torch.uint8), scale_out, scale_arg, amax_target, rows, k, k,
                    *geometry, BLOCK_ROWS=QUANTIZE_TILE_ROWS, WIDTH=QUANTIZE_TILE_COLUMNS,
                    AMAX_ONLY=amax_only, num_warps=QUANTIZE_TILE_WARPS,
                    **_kernel_flags(fmt, kind, words, traceable))
    else:
        plan = fused_plan(x, gate, weight, fmt, tiling, group_size=group_size,
                          zero_centered_gamma=zero_centered_gamma,
                          activation=activation, norm_before_gate=norm_before_gate,
                          rounding=rounding, store_rstd=store_rstd, traceable=traceable)
        x, gate = plan.x, plan.gate
        weight_arg = x if weight is None else weight
        if fmt.columnwise:
            run(plan.kernel)[plan.grid](
                x, gate, weight_arg, data.view(torch.uint8), scale_out,
                col_data.view(torch.uint8), col_scale_out, rstd, *plan.layout_args, k,
                *geometry, col_scales.shape[1], group_size, num_groups, eps, **plan.meta)
        else:
            passes = (True, False) if kind == TENSOR_CURRENT else (False,)
            for amax_only in passes:
                run(plan.kernel)[plan.grid](
                    x, gate, weight_arg, data.view(torch.uint8), scale_out, rstd, scale_arg,
                    amax_target, *plan.layout_args, k, *geometry, group_size, num_groups, eps,
                    AMAX_ONLY=amax_only, **plan.meta)
    return data, scales, rstd, amax, col_data, col_scales
