"""Host-side launchers: allocate outputs, describe the layout, pick a config, launch.

Inputs arrive validated (gatednorm.functional) with a unit-stride last dim. ``traceable``
launches through ``torch.library.wrap_triton`` so that a registered ``triton_op`` can be
traced by torch.compile; the eager path launches the kernels directly, which saves the
higher-order-op dispatch on every call.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch
import triton
from torch.library import wrap_triton

from gatednorm.kernels.backward import (
    INPUT_GRADS_PASS,
    ROW_DOTS_PASS,
    WHOLE_GROUPS,
    backward_tile_kernel,
    dweight_reduce_kernel,
)
from gatednorm.kernels import config as _config
from gatednorm.kernels.config import (
    BACKWARD_PARTIAL_TILE_TARGET_PROGRAMS,
    BACKWARD_TARGET_PROGRAMS,
    BACKWARD_TILE_TARGET_PROGRAMS,
    DEFAULT_SHARED_MEMORY_BYTES,
    backward_chunking,
    backward_config,
    backward_target_programs,
    few_rows_forward_config,
    fit_shared_memory,
    forward_chunking,
    forward_config,
    forward_target_programs,
    forward_tile_store,
    shares_row_offsets,
)
from gatednorm.kernels.fast_launch import CachedLaunch
from gatednorm.kernels.forward import (
    forward_long_row_kernel,
    forward_row_loop_kernel,
    forward_tile_kernel,
)
from gatednorm.kernels.layout import RowLayout, row_layout

ACTIVATION_FLAG = {"silu": 0, "sigmoid": 1}
ROUNDING_FLAG = {"te": 0, "fp32": 1, "hf": 2}
DWEIGHT_BLOCK_CHUNKS = 128
DWEIGHT_BLOCK_COLS = 32
# Two reduction levels cover every chunk count the backward can produce.
assert (max(BACKWARD_TARGET_PROGRAMS, *BACKWARD_TILE_TARGET_PROGRAMS.values(),
            *BACKWARD_PARTIAL_TILE_TARGET_PROGRAMS.values()) <= DWEIGHT_BLOCK_CHUNKS ** 2)


@dataclass(frozen=True)
class _Plan:
    """Everything about a launch that depends only on shapes, strides, dtypes and options."""

    kernel: object
    grid: tuple[int]
    layout_args: tuple
    meta: dict
    layout_copies: bool
    # Eager plans only: the main kernel and the two dweight reduction levels, relaunched
    # without Triton's argument binding (fast_launch.py).
    cached_launch: CachedLaunch | None = None
    reduce_launches: tuple[CachedLaunch, CachedLaunch] | None = None
    # Backward: programs per chunk of rows (num_groups, times the blocks a group is cut into
    # when wider than a tile); with a cut, the first of the two launches (ROW_DOTS_PASS).
    column_blocks: int = 0
    row_dots_meta: dict | None = None
    row_dots_launch: CachedLaunch | None = None


# Plans of eager calls, keyed by shapes, strides, dtypes and options: a decode step repeats the
# same call thousands of times, and rebuilding the plan costs more than the kernel at that size.
# The inference launchers bound to whole call signatures (inference_forward) live here too.
_PLANS: dict[tuple, object] = {}
_MAX_PLANS = 4096


def _cached_plan(key, build):
    if key is None:
        return build()
    plan = _PLANS.get(key)
    if plan is None:
        plan = build()
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


cached, clear_cache = _cached_plan, lambda: _PLANS.clear()


def _meta(layout: RowLayout, config, x_dtype: torch.dtype, weight, zero_centered_gamma: bool,
          activation: str, norm_before_gate: bool, rounding: str) -> dict:
    return dict(
        LEADING_DIMS=layout.leading_dims,
        ROW_ALIGN=min(layout.row_align, config.max_vector_elements or layout.row_align),
        BLOCK_ROWS=config.block_rows, BLOCK_N=config.block_n, TAIL_N=config.tail_n,
        LOOP_STAGES=config.loop_stages,
        HAS_WEIGHT=weight is not None, ZERO_CENTERED=zero_centered_gamma,
        ACTIVATION=ACTIVATION_FLAG[activation], NORM_BEFORE_GATE=norm_before_gate,
        ROUNDING=ROUNDING_FLAG[rounding],
        # "hf" multiplies the weight in its own dtype: rounded when it shares x's 16-bit dtype.
        WEIGHT_PRODUCT_ROUNDED=(weight is not None and weight.dtype == x_dtype
                                and x_dtype != torch.float32),
        num_warps=config.num_warps,
    )


def _layout_args(layout: RowLayout) -> tuple:
    args = [layout.rows, layout.size1, layout.size2]
    for strides in layout.strides:
        args.extend(strides)
    return tuple(args)


@functools.cache
def shared_memory_bytes(device: torch.device) -> int:
    """Shared memory one block may opt into on ``device``."""
    if device.type != "cuda":
        return DEFAULT_SHARED_MEMORY_BYTES
    properties = torch.cuda.get_device_properties(device)
    return int(getattr(properties, "shared_memory_per_block_optin", 0)
               or DEFAULT_SHARED_MEMORY_BYTES)


@functools.cache
def _programmatic_launch_supported(device: torch.device) -> bool:
    """Whether launches on ``device`` can overlap the previous launch in their stream
    (programmatic dependent launch: CUDA sm_90 and newer; not the interpreter or ROCm)."""
    return (device.type == "cuda" and not torch.version.hip
            and torch.cuda.get_device_capability(device)[0] >= 9)


def _row_layout_of(inputs: list[torch.Tensor], outputs: list[torch.Tensor], group_size: int):
    """(layout, copies): copies is True when more than three leading dims stay apart after
    merging, in which case the inputs must be made contiguous first (outputs always are)."""
    layout = row_layout(inputs + outputs, group_size)
    if layout is not None:
        return layout, False
    inputs = [t.contiguous() for t in inputs]
    return row_layout(inputs + outputs, group_size), True


def forward(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor | None, *, eps: float,
            zero_centered_gamma: bool, activation: str, norm_before_gate: bool,
            group_size: int, rounding: str, traceable: bool, store_rstd: bool = True):
    """Returns (y, rstd): y like x (contiguous), rstd fp32 of shape [..., D // group_size]
    (None when ``store_rstd`` is False: inference needs no backward)."""
    d = x.shape[-1]
    num_groups = d // group_size
    # empty_like is a few microseconds cheaper per call than torch.empty(shape, ...) on a slow
    # host; the output is always contiguous, whatever x's strides.
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    rstd = (torch.empty((*x.shape[:-1], num_groups), dtype=torch.float32, device=x.device)
            if store_rstd else None)
    if x.numel() == 0:
        return y, rstd

    def build() -> _Plan:
        layout, copies = _row_layout_of([x, gate], [y], group_size)
        config = forward_config(group_size)
        if isinstance(layout.rows, int):
            config = few_rows_forward_config(config, layout.rows, num_groups)
        if not config.long_row and max(x.element_size(), gate.element_size()) > 2:
            # With fp32 x the row loop's pipelined loads changed the register layout of the
            # sum of squares, and with it rstd's last bit: y differed between the kernel
            # variants with and without the rstd store (GPU suite run 6). The table was
            # tuned on 16-bit inputs; an fp32 x or gate keeps the one-tile kernel.
            config = replace(config, loop_stages=1)
        elif not config.long_row:
            # The row loop prefetches x and gate: (stages - 1) tiles of both.
            config = fit_shared_memory(config, x.element_size() + gate.element_size(),
                                       shared_memory_bytes(x.device))
        meta = _meta(layout, config, x.dtype, weight, zero_centered_gamma, activation,
                     norm_before_gate, rounding)
        meta["STORE_RSTD"] = store_rstd
        layout_args = _layout_args(layout) + (group_size, num_groups)
        if config.long_row:
            kernel = forward_long_row_kernel
            del meta["TAIL_N"]  # the long-row kernel loops over block_n-wide chunks
            grid = (layout.rows * num_groups,)
        elif config.loop_stages > 1:
            kernel = forward_row_loop_kernel
            rows_per_chunk, num_chunks = forward_chunking(layout.rows, num_groups,
                                                          config.block_rows,
                                                          forward_target_programs(config))
            grid = (num_chunks * num_groups,)
            layout_args += (rows_per_chunk,)
        else:
            kernel = forward_tile_kernel
            grid = (triton.cdiv(layout.rows, config.block_rows) * num_groups,)
            del meta["LOOP_STAGES"]  # the tile kernel has no loop
            by_ptx, share = forward_tile_store(config, x.dtype, activation,
                                               layout.leading_dims, store_rstd, traceable)
            _, gate_as_x, y_as_x = layout.rows_as_first
            meta.update(RSTD_BY_PTX=by_ptx, GATE_ROWS_AS_X=share and gate_as_x,
                        Y_ROWS_AS_X=share and y_as_x)
        return _Plan(
            kernel=kernel,
            grid=grid,
            layout_args=layout_args,
            meta=meta,
            layout_copies=copies,
            cached_launch=None if traceable else CachedLaunch(kernel, meta),
        )

    key = None if traceable else _forward_key(x, gate, weight, group_size, zero_centered_gamma,
                                              activation, norm_before_gate, rounding, store_rstd)
    plan = _cached_plan(key, build)
    if plan.layout_copies:
        x, gate = x.contiguous(), gate.contiguous()
    weight_arg = x if weight is None else weight
    rstd_arg = y if rstd is None else rstd
    if traceable:
        wrap_triton(plan.kernel)[plan.grid](
            x, gate, weight_arg, y, rstd_arg, *plan.layout_args, eps, **plan.meta)
    else:
        plan.cached_launch(plan.grid, (x, gate, weight_arg, y, rstd_arg),
                           (*plan.layout_args, eps))
    return y, rstd


def _forward_key(x, gate, weight, group_size, zero_centered_gamma, activation, norm_before_gate,
                 rounding, store_rstd) -> tuple:
    # The device too: a compiled kernel belongs to the device it was loaded on.
    return ("fwd", x.shape, x.stride(), gate.stride(), x.dtype, gate.dtype,
            None if weight is None else weight.dtype, x.device, group_size,
            zero_centered_gamma, activation, norm_before_gate, rounding, store_rstd)


class _InferenceLaunch:
    """A forward without rstd bound to one call signature (shapes, strides, dtypes, device,
    options, eps): allocates y and relaunches the plan's kernel, nothing else."""

    __slots__ = ("launch", "grid", "scalars")

    def __init__(self, plan: _Plan, eps: float):
        self.launch = plan.cached_launch
        self.grid = plan.grid
        self.scalars = (*plan.layout_args, eps)

    def __call__(self, x: torch.Tensor, gate: torch.Tensor,
                 weight: torch.Tensor | None) -> torch.Tensor:
        y = torch.empty_like(x, memory_format=torch.contiguous_format)
        # y stands in for the rstd pointer the kernel does not write (STORE_RSTD off).
        self.launch(self.grid, (x, gate, x if weight is None else weight, y, y), self.scalars)
        return y


def inference_launcher(signature: tuple):
    """The launcher remembered by :func:`inference_forward` under ``signature``, or None."""
    return _PLANS.get(signature)


def inference_forward(signature: tuple, x: torch.Tensor, gate: torch.Tensor,
                      weight: torch.Tensor | None, *, eps: float, zero_centered_gamma: bool,
                      activation: str, norm_before_gate: bool, group_size: int,
                      rounding: str) -> torch.Tensor:
    """y of a forward that needs no gradient (no rstd), launched eagerly; the launch is
    remembered under ``signature`` for :func:`inference_launcher`. ``signature`` must
    determine everything the launch depends on (shapes, strides, dtypes, device, options,
    eps) and the inputs must have unit last-dim strides. Kept with the plans, so that
    whatever clears the plans clears these too."""
    options = dict(zero_centered_gamma=zero_centered_gamma, activation=activation,
                   norm_before_gate=norm_before_gate, group_size=group_size, rounding=rounding)
    y, _ = forward(x, gate, weight, eps=eps, traceable=False, store_rstd=False, **options)
    plan = _PLANS.get(_forward_key(x, gate, weight, store_rstd=False, **options))
    if plan is not None and not plan.layout_copies:
        _cached_plan(signature, lambda: _InferenceLaunch(plan, eps))
    return y


def backward(dy: torch.Tensor, x: torch.Tensor, gate: torch.Tensor,
             weight: torch.Tensor | None, rstd: torch.Tensor, *, zero_centered_gamma: bool,
             activation: str, norm_before_gate: bool, group_size: int, rounding: str,
             traceable: bool):
    """Returns (dx, dgate, dweight): dx like x, dgate like gate, dweight like weight (or an
    empty tensor without a weight). dweight sums fp32 partials in a fixed order."""
    d = x.shape[-1]
    num_groups = d // group_size
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    dgate = torch.empty_like(gate, memory_format=torch.contiguous_format)
    if weight is None:
        dweight = torch.empty(0, dtype=x.dtype, device=x.device)
    else:
        dweight = torch.empty(weight.shape, dtype=weight.dtype, device=weight.device)
    if x.numel() == 0:
        if weight is not None:
            dweight.zero_()
        return dx, dgate, dweight
    if dy.stride(-1) != 1:
        dy = dy.contiguous()

    def build() -> _Plan:
        layout, copies = _row_layout_of([x, gate, dy], [dx, dgate], group_size)
        config = backward_config(group_size)
        config = fit_shared_memory(config, x.element_size() + gate.element_size()
                                   + dy.element_size(), shared_memory_bytes(x.device))
        # A group wider than the tile is cut into blocks of block_n columns (two launches);
        # a tile holds whole groups otherwise (its tail_n columns too).
        column_blocks = num_groups * (triton.cdiv(group_size, config.block_n)
                                      if config.long_row else 1)
        rows_per_chunk, num_chunks = backward_chunking(layout.rows, column_blocks,
                                                       config.block_rows,
                                                       backward_target_programs(config))
        meta = _meta(layout, config, x.dtype, weight, zero_centered_gamma, activation,
                     norm_before_gate, rounding)
        share = shares_row_offsets(config, layout.leading_dims, group_size)
        _, gate_as_x, dy_as_x, dx_as_x, dgate_as_x = layout.rows_as_first
        cached = not traceable
        # Programmatic dependent launch: each launch after the first carries the attribute and
        # waits for its predecessor's writes; it starts as the predecessor's programs exit, or
        # from the predecessor's first instruction with BACKWARD_EARLY_DEPENDENTS. Traced
        # launches keep plain stream order (Inductor launches them itself).
        pdl = (cached and _config.BACKWARD_PROGRAMMATIC_LAUNCH
               and _programmatic_launch_supported(x.device))
        early = pdl and _config.BACKWARD_EARLY_DEPENDENTS
        meta.update(GATE_ROWS_AS_X=share and gate_as_x, DY_ROWS_AS_X=share and dy_as_x,
                    DX_ROWS_AS_X=share and dx_as_x, DGATE_ROWS_AS_X=share and dgate_as_x,
                    SPLIT_PASS=WHOLE_GROUPS.value, DOT_BLOCKS=1,
                    LAUNCH_DEPENDENTS=early and weight is not None, WAIT_FOR_PRIOR_GRID=False)
        row_dots_meta = None
        if config.long_row:
            dot_blocks = triton.next_power_of_2(column_blocks // num_groups)
            row_dots_meta = dict(meta, SPLIT_PASS=ROW_DOTS_PASS.value, DOT_BLOCKS=dot_blocks,
                                 LAUNCH_DEPENDENTS=early)
            meta.update(SPLIT_PASS=INPUT_GRADS_PASS.value, DOT_BLOCKS=dot_blocks,
                        WAIT_FOR_PRIOR_GRID=pdl)
            if pdl:
                meta["launch_pdl"] = True
        return _Plan(
            kernel=backward_tile_kernel,
            grid=(num_chunks * column_blocks,),
            layout_args=_layout_args(layout) + (group_size, num_groups, column_blocks,
                                                rows_per_chunk, d),
            meta=meta,
            layout_copies=copies,
            cached_launch=CachedLaunch(backward_tile_kernel, meta) if cached else None,
            reduce_launches=(CachedLaunch(dweight_reduce_kernel, _reduce_meta(pdl, early)),
                             CachedLaunch(dweight_reduce_kernel, _reduce_meta(pdl, False)))
            if cached else None,
            row_dots_meta=row_dots_meta,
            row_dots_launch=(CachedLaunch(backward_tile_kernel, row_dots_meta)
                             if cached and row_dots_meta is not None else None),
            column_blocks=column_blocks,
        )

    key = None if traceable else (
        "bwd", x.shape, x.stride(), gate.stride(), dy.stride(), x.dtype, gate.dtype, dy.dtype,
        None if weight is None else weight.dtype, x.device, group_size, zero_centered_gamma,
        activation, norm_before_gate, rounding)
    plan = _cached_plan(key, build)
    if plan.layout_copies:
        x, gate, dy = x.contiguous(), gate.contiguous(), dy.contiguous()
    num_chunks = plan.grid[0] // plan.column_blocks
    blocks = triton.cdiv(num_chunks, DWEIGHT_BLOCK_CHUNKS)
    # One flat fp32 buffer: the chunk partials, then the block sums of the first reduction
    # level. Flat, because a [num_chunks, d] shape would make torch.compile guard on
    # num_chunks == 1.
    scratch = torch.empty(((num_chunks + blocks) * d,) if weight is not None else (0,),
                          dtype=torch.float32, device=x.device)
    # One fp32 per row and column block; unused without a split, where any fp32 tensor
    # stands in for the pointer.
    row_dots = (torch.empty((x.numel() // d * plan.column_blocks,),
                            dtype=torch.float32, device=x.device)
                if plan.row_dots_meta is not None else rstd)
    tensors = (x, gate, x if weight is None else weight, dy, rstd, dx, dgate, scratch,
               row_dots)
    if traceable:
        if plan.row_dots_meta is not None:
            wrap_triton(plan.kernel)[plan.grid](*tensors, *plan.layout_args,
                                                **plan.row_dots_meta)
        wrap_triton(plan.kernel)[plan.grid](*tensors, *plan.layout_args, **plan.meta)
    else:
        if plan.row_dots_launch is not None:
            plan.row_dots_launch(plan.grid, tensors, plan.layout_args)
        plan.cached_launch(plan.grid, tensors, plan.layout_args)
    if weight is not None:
        _reduce_partials(scratch, dweight, num_chunks, blocks, d, plan.reduce_launches)
    return dx, dgate, dweight


_REDUCE_META = dict(BLOCK_CHUNKS=DWEIGHT_BLOCK_CHUNKS, BLOCK_COLS=DWEIGHT_BLOCK_COLS,
                    LAUNCH_DEPENDENTS=False, WAIT_FOR_PRIOR_GRID=False, num_warps=4)


def _reduce_meta(pdl: bool, launch_dependents: bool) -> dict:
    """Meta of an eager reduction launch: with ``pdl`` it may start while the launch before
    it runs and waits for that launch's writes."""
    if not pdl:
        return _REDUCE_META
    return dict(_REDUCE_META, LAUNCH_DEPENDENTS=launch_dependents, WAIT_FOR_PRIOR_GRID=True,
                launch_pdl=True)


def _reduce_partials(scratch: torch.Tensor, dweight: torch.Tensor, num_chunks: int,
                     blocks: int, d: int, launches) -> None:
    """Sum the num_chunks x d fp32 partials at the start of ``scratch`` into dweight in two
    fixed levels: blocks of DWEIGHT_BLOCK_CHUNKS rows in parallel into the block sums that
    follow them in ``scratch``, then the block sums. Always two launches, so the order of the
    additions depends only on num_chunks and torch.compile sees no shape branch."""
    partials = scratch[: num_chunks * d]
    block_sums = scratch[num_chunks * d:]
    column_blocks = triton.cdiv(d, DWEIGHT_BLOCK_COLS)
    levels = ((partials, block_sums, num_chunks, (column_blocks, blocks)),
              (block_sums, dweight, blocks, (column_blocks, 1)))
    for level, (source, out, rows, grid) in enumerate(levels):
        if launches is None:
            wrap_triton(dweight_reduce_kernel)[grid](source, out, rows, d, **_REDUCE_META)
        else:
            launches[level](grid, (source, out), (rows, d))
