"""What the launcher would launch for a call, without tensors or a GPU (tests read this)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

from gatednorm.kernels import config, launch

# Launch flags that change how a kernel addresses or stores, never what it computes.
ROW_FLAGS = ("GATE_ROWS_AS_X", "Y_ROWS_AS_X", "DY_ROWS_AS_X", "DX_ROWS_AS_X",
             "DGATE_ROWS_AS_X", "RSTD_BY_PTX")


@dataclass(frozen=True)
class LaunchPlan:
    """One pass's launch: ``kernel`` over ``grid`` = (programs,), [block_rows, block_n]
    tiles (plus a block_rows x tail_n tail) on num_warps warps, loop_stages deep;
    rows_per_chunk for the looping kernels (None for one tile a program); vector_elements:
    the loads' width hint (ROW_ALIGN); column_blocks: the backward's programs per chunk of
    rows; launches: every kernel launched, in order; flags: the ROW_FLAGS set."""

    kernel: str
    block_rows: int
    block_n: int
    tail_n: int
    num_warps: int
    loop_stages: int
    programs: int
    grid: tuple[int, ...]
    rows_per_chunk: int | None
    vector_elements: int
    column_blocks: int
    launches: tuple[str, ...]
    flags: tuple[str, ...]


def _plan(x_shape, dtype, *, pass_, group_size, gate_dtype, weight_dtype, with_weight,
          activation, norm_before_gate, rounding, zero_centered_gamma, strides, gate_strides,
          store_rstd, traceable, shared_memory, programmatic_launch):
    """The launcher's own plan object for :func:`describe`'s arguments."""
    if pass_ not in ("forward", "backward"):
        raise ValueError(f"pass_ must be 'forward' or 'backward', got {pass_!r}")
    group_size = group_size or x_shape[-1]

    def tensor(dtype_, strides_=None):
        if strides_ is None:
            return torch.empty(x_shape, dtype=dtype_, device="meta")
        return torch.empty_strided(x_shape, strides_, dtype=dtype_, device="meta")

    x = tensor(dtype, strides)
    gate = tensor(gate_dtype or dtype, gate_strides)
    weight = (torch.empty(x_shape[-1], dtype=weight_dtype or dtype, device="meta")
              if with_weight else None)
    options = dict(zero_centered_gamma=zero_centered_gamma, activation=activation,
                   norm_before_gate=norm_before_gate, group_size=group_size, rounding=rounding,
                   traceable=traceable, shared_memory=shared_memory)
    if pass_ == "forward":
        return launch._forward_plan(x, gate, weight, tensor(dtype), store_rstd=store_rstd,
                                    **options)
    return launch._backward_plan(x, gate, weight, tensor(dtype), tensor(dtype),
                                 tensor(gate_dtype or dtype),
                                 pdl_supported=programmatic_launch, **options)


def describe(x_shape: tuple[int, ...], dtype: torch.dtype = torch.bfloat16, *,
             pass_: str = "forward", group_size: int | None = None,
             gate_dtype: torch.dtype | None = None, weight_dtype: torch.dtype | None = None,
             with_weight: bool = True, activation: str = "silu", norm_before_gate: bool = True,
             rounding: str = "te", zero_centered_gamma: bool = False,
             strides: tuple[int, ...] | None = None, gate_strides: tuple[int, ...] | None = None,
             store_rstd: bool = True, traceable: bool = False,
             shared_memory: int = config.DEFAULT_SHARED_MEMORY_BYTES,
             programmatic_launch: bool = True) -> LaunchPlan:
    """The plan of ``pass_`` ("forward" or "backward") for x of ``x_shape`` and ``dtype``
    (gate and dy alike unless given; weight of ``weight_dtype``, by default x's), as the
    eager launcher (or with ``traceable``, the torch.compile one) builds it on a device with
    ``shared_memory`` bytes a block and, for ``programmatic_launch``, sm_90's chained
    launches. ``strides``: x's element strides (default contiguous); ``gate_strides``: the
    gate's (e.g. a slice of a projection output)."""
    plan = _plan(x_shape, dtype, pass_=pass_, group_size=group_size, gate_dtype=gate_dtype,
                 weight_dtype=weight_dtype, with_weight=with_weight, activation=activation,
                 norm_before_gate=norm_before_gate, rounding=rounding,
                 zero_centered_gamma=zero_centered_gamma, strides=strides,
                 gate_strides=gate_strides, store_rstd=store_rstd, traceable=traceable,
                 shared_memory=shared_memory, programmatic_launch=programmatic_launch)
    if pass_ == "forward":
        launches = (plan.kernel.fn.__name__,)
        rows_per_chunk = plan.decision.rows_per_chunk
        column_blocks = plan.grid[0]
    else:
        kernel = plan.kernel.fn.__name__
        launches = ((kernel,) * (2 if plan.row_dots_meta is not None else 1)
                    + ("dweight_reduce_kernel",) * (2 if with_weight else 0))
        rows_per_chunk = plan.decision.rows_per_chunk
        column_blocks = plan.column_blocks
    tile = plan.decision.tile
    return LaunchPlan(
        kernel=plan.kernel.fn.__name__, block_rows=tile.block_rows, block_n=tile.block_n,
        tail_n=tile.tail_n, num_warps=tile.num_warps,
        loop_stages=plan.meta.get("LOOP_STAGES", 1), programs=plan.grid[0], grid=plan.grid,
        rows_per_chunk=rows_per_chunk, vector_elements=plan.meta["ROW_ALIGN"],
        column_blocks=column_blocks if pass_ == "backward" else 0, launches=launches,
        flags=tuple(flag for flag in ROW_FLAGS if plan.meta.get(flag)))


@dataclass(frozen=True)
class KernelLaunch:
    """One launch of a tile kernel as the launcher makes it: ``kernel`` (the Triton
    function), its ``constexprs`` (num_warps among them) and ``integers``, its integer
    arguments by name. The tensors and eps are what it passes besides."""

    kernel: Any
    constexprs: dict
    integers: dict


def kernel_launches(*args, **kwargs) -> tuple[KernelLaunch, ...]:
    """The tile-kernel launches of the pass that :func:`describe` describes (same arguments),
    in order, with what they pass: what an offline compilation of the kernels needs. The
    dweight reduction's launches, which take no call-dependent constexpr, are left out."""
    # describe()'s arguments by name, its defaults filled in.
    bound = inspect.signature(describe).bind(*args, **kwargs)
    bound.apply_defaults()
    plan = _plan(**bound.arguments)
    metas = [plan.meta]
    if plan.row_dots_meta is not None:
        metas.insert(0, plan.row_dots_meta)
    kernel = plan.kernel
    # Tensor arguments are upper-case; eps is the one float.
    names = [p.name for p in kernel.params
             if not p.is_constexpr and not p.name.isupper() and p.name != "eps"]
    if len(names) != len(plan.layout_args):
        raise AssertionError(f"{kernel.__name__}: integer arguments {names} against the "
                             f"launcher's {plan.layout_args}")
    integers = dict(zip(names, (int(value) for value in plan.layout_args)))
    return tuple(KernelLaunch(kernel, {k: v for k, v in meta.items() if k != "launch_pdl"},
                              integers) for meta in metas)
