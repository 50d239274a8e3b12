"""DTensor sharding rules of the registered ops ``gatednorm::rms_norm_gated_fwd`` / ``_bwd``.

The norm is local to a row, or to a group of ``group_size`` columns of a row, so each rank
computes its shard without communication whenever its shard holds whole rows or whole groups:

- x sharded on a leading dim (tokens, batch, heads): y, rstd, dx and dgate are sharded the same
  way, the weight is read replicated and dweight is a ``Partial("sum")`` (each rank summed its
  own rows; DTensor reduces it when asked, as for any parameter gradient).
- x sharded on its last dim in shards of whole groups (Mamba2-style tensor parallelism): the
  same, with the weight and dweight sharded on their dim 0 alike. A shard that would split a
  group raises a ValueError naming x's placement; nothing is gathered behind the user's back.
- x replicated: everything replicated. A ``Partial`` x is reduced first (the norm is not linear).

x's placement decides: the gate, the weight, and in the backward dy and rstd, are redistributed
to the placement that x's implies, whatever they came with. The backward follows the saved x.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpSpec,
    OpStrategy,
    RuntimeSchemaInfo,
)
from torch.distributed.tensor._ops.utils import generate_redistribute_costs
from torch.distributed.tensor.placement_types import Placement

# Argument positions in the registered schemas.
FWD_GROUP_SIZE = 7
BWD_X, BWD_GROUP_SIZE = 1, 9


def _is_shard(placement: Placement) -> bool:
    return isinstance(placement, Shard)


def _shard_lengths(length: int, parts: list[int]) -> list[int]:
    """Column counts of the shards of a dim of ``length`` split by nested mesh dims of sizes
    ``parts``, in DTensor's chunk convention (ceil-sized chunks, the last ones short or empty)."""
    lengths = [length]
    for n in parts:
        split = []
        for size in lengths:
            chunk = -(-size // n) if size else 0
            split += [max(0, min(chunk, size - i * chunk)) for i in range(n)]
        lengths = split
    return lengths


def _check_whole_groups(placements, mesh, shape, group_size: int, name: str) -> None:
    last = len(shape) - 1
    mesh_dims = [m for m, p in enumerate(placements) if _is_shard(p) and p.dim == last]
    if not mesh_dims:
        return
    if any(type(placements[m]) is not Shard for m in mesh_dims):
        raise ValueError(
            f"{name} is sharded on its last dim with {tuple(placements)}: only plain Shard "
            f"placements are supported on the normalized dim")
    lengths = _shard_lengths(shape[-1], [mesh.size(m) for m in mesh_dims])
    if all(n % group_size == 0 for n in lengths):
        return
    sizes = ", ".join(str(n) for n in lengths)
    raise ValueError(
        f"{name} has placements {tuple(placements)} on a mesh of shape {tuple(mesh.shape)}: its "
        f"last dim ({shape[-1]}) is sharded into shards of {sizes} columns, which splits groups "
        f"of group_size={group_size} (the whole last dim when group_size is None). Each shard "
        f"must hold whole groups: shard x and gate on a leading dim, choose a mesh size whose "
        f"shards are multiples of {group_size} columns, or redistribute them to Replicate on "
        f"that mesh dim")


def _canonical(placement: Placement, ndim: int) -> Placement:
    # Shard(-1) and Shard(ndim - 1) are the same placement; the rules compare dims.
    if type(placement) is Shard and placement.dim < 0:
        return Shard(placement.dim + ndim)
    return placement


def row_placements(placements, mesh, shape, group_size: int,
                   name: str = "x") -> tuple[Placement, ...]:
    """The placements x, the gate, y, rstd, dx and dgate are computed in, from x's
    ``placements`` on ``mesh`` and its global ``shape``; a ValueError where a shard would split
    a group."""
    placements = tuple(_canonical(p, len(shape)) for p in placements)
    _check_whole_groups(placements, mesh, shape, group_size, name)
    return tuple(Replicate() if isinstance(p, Partial) else p for p in placements)


def weight_placements(rows: tuple[Placement, ...], last: int) -> tuple[Placement, ...]:
    return tuple(Shard(0) if _is_shard(p) and p.dim == last else Replicate() for p in rows)


def dweight_placements(rows: tuple[Placement, ...], last: int) -> tuple[Placement, ...]:
    def one(p):
        if not _is_shard(p):
            return Replicate()
        return Shard(0) if p.dim == last else Partial()

    return tuple(one(p) for p in rows)


def _input_spec(strategy: OpStrategy, placements) -> DTensorSpec:
    current = strategy.strategies[0].output_spec
    return DTensorSpec(current.mesh, tuple(placements), tensor_meta=current.tensor_meta)


def _one_strategy(outputs, inputs: list[tuple[OpStrategy, tuple[Placement, ...]]]) -> OpStrategy:
    input_specs = [_input_spec(strategy, placements) for strategy, placements in inputs]
    costs = [generate_redistribute_costs(strategy, spec)
             for (strategy, _), spec in zip(inputs, input_specs)]
    return OpStrategy([OpSpec(output_specs=outputs, input_specs=input_specs,
                              redistribute_cost=costs)])


def _x_spec(strategy, name: str) -> DTensorSpec:
    if not isinstance(strategy, OpStrategy):
        raise TypeError(f"{name} must be a DTensor when the other inputs are")
    return strategy.strategies[0].output_spec


def forward_strategy(op_schema: OpSchema) -> OpStrategy:
    x, gate, weight = op_schema.args_schema[:3]
    group_size = op_schema.args_schema[FWD_GROUP_SIZE]
    x_spec = _x_spec(x, "x")
    rows = row_placements(x_spec.placements, x_spec.mesh, x_spec.shape, group_size)
    mesh, last = x_spec.mesh, x_spec.ndim - 1
    inputs = [(x, rows), (gate, rows)]
    if weight is not None:
        inputs.append((weight, weight_placements(rows, last)))
    outputs = (DTensorSpec(mesh, rows), DTensorSpec(mesh, rows))
    return _one_strategy(outputs, inputs)


def backward_strategy(op_schema: OpSchema) -> OpStrategy:
    dy, x, gate, weight, rstd = op_schema.args_schema[:5]
    group_size = op_schema.args_schema[BWD_GROUP_SIZE]
    x_spec = _x_spec(x, "x")
    rows = row_placements(x_spec.placements, x_spec.mesh, x_spec.shape, group_size)
    mesh, last = x_spec.mesh, x_spec.ndim - 1
    inputs = [(dy, rows), (x, rows), (gate, rows)]
    if weight is not None:
        inputs.append((weight, weight_placements(rows, last)))
        dweight = dweight_placements(rows, last)
    else:
        # The op returns an empty placeholder for dweight without a weight.
        dweight = tuple(Replicate() for _ in rows)
    inputs.append((rstd, rows))
    outputs = (DTensorSpec(mesh, rows), DTensorSpec(mesh, rows), DTensorSpec(mesh, dweight))
    return _one_strategy(outputs, inputs)


def register() -> None:
    """Registers both rules with DTensor (idempotent: a second call replaces them)."""
    propagator = DTensor._op_dispatcher.sharding_propagator
    # Every non-tensor argument from eps on is part of the cached propagation key.
    propagator.register_op_strategy(torch.ops.gatednorm.rms_norm_gated_fwd.default,
                                    forward_strategy, RuntimeSchemaInfo(static_argnum=3))
    propagator.register_op_strategy(torch.ops.gatednorm.rms_norm_gated_bwd.default,
                                    backward_strategy, RuntimeSchemaInfo(static_argnum=5))


__all__ = ["backward_strategy", "dweight_placements", "forward_strategy", "register",
           "row_placements", "weight_placements"]
