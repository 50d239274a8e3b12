"""gatednorm on DTensors: tensor, sequence and FSDP2 parallelism without gathering.

Importing this package registers DTensor sharding rules for the registered ops
``torch.ops.gatednorm.rms_norm_gated_fwd`` and ``rms_norm_gated_bwd`` (see
:mod:`gatednorm.distributed.sharding`). :func:`gatednorm.rms_norm_gated` imports it on its
first DTensor call, so ``import gatednorm`` does not pay for ``torch.distributed.tensor``.

Placements, decided by x's (the gate, weight and dy are redistributed to match):

====================================  ======================  =========  ==================
x (and the gate)                      y, dx, dgate            weight     dweight
====================================  ======================  =========  ==================
``Shard(d)``, d a leading dim         ``Shard(d)``            Replicate  ``Partial("sum")``
``Shard(-1)``, shards of whole groups ``Shard(-1)``           Shard(0)   ``Shard(0)``
``Replicate()`` (or ``Partial``)      ``Replicate()``         Replicate  ``Replicate()``
====================================  ======================  =========  ==================

A last-dim shard that splits a group raises a ValueError naming x's placement. On several mesh
dims each is read on its own (``[Shard(0), Shard(-1)]`` gives a dweight of
``[Partial(), Shard(0)]``).
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

from gatednorm import reference
from gatednorm.options import GatedNormOptions
from gatednorm.distributed import sharding
from gatednorm.distributed.sharding import dweight_placements, row_placements, weight_placements

__all__ = ["dtensor_call", "rms_norm_gated"]

sharding.register()


def dtensor_call(x, gate, weight) -> bool:
    """Whether the call takes DTensors: True when x, the gate and the weight (if any) are all
    DTensors on one mesh, False when none is; a mix, or two meshes, raise naming the argument."""
    named = [("x", x), ("gate", gate)] + ([("weight", weight)] if weight is not None else [])
    dtensors = [(name, t) for name, t in named if isinstance(t, DTensor)]
    if not dtensors:
        return False
    for name, t in named:
        if not isinstance(t, DTensor):
            raise TypeError(
                f"{name} must be a DTensor like {dtensors[0][0]} (placements "
                f"{dtensors[0][1].placements}), got a plain {type(t).__name__}; convert it with "
                f"torch.distributed.tensor.distribute_tensor or DTensor.from_local")
    mesh = x.device_mesh
    for name, t in named[1:]:
        if t.device_mesh != mesh:
            raise ValueError(
                f"{name} must be on x's device mesh {mesh}, got {t.device_mesh} "
                f"(placements {t.placements})")
    return True


def rms_norm_gated(x: DTensor, gate: DTensor, weight: DTensor | None,
                   options: GatedNormOptions, *, fused: bool) -> DTensor:
    """The gated norm of checked DTensor arguments (``options.group_size`` an int), placed as
    the table above says. ``fused`` (the local shards run the Triton kernels) calls the registered op,
    which DTensor propagates with the sharding rules; otherwise (CPU without the interpreter,
    float64) each rank runs the reference composite on its shards, placed by the same rules."""
    # Checked here too so that a split group is a ValueError, not DTensor's RuntimeError.
    mesh, last = x.device_mesh, x.dim() - 1
    rows = row_placements(x.placements, mesh, x.shape, options.group_size)
    if fused:
        # The kernels read a unit-stride last dim, as on the plain path.
        x, gate = (t if t.stride(-1) == 1 else t.contiguous() for t in (x, gate))
        if weight is not None and weight.stride(-1) != 1:
            weight = weight.contiguous()
        y, _ = torch.ops.gatednorm.rms_norm_gated_fwd(x, gate, weight, *options.op_arguments())
        return y
    x_local = _LocalShard.apply(x, rows, rows)
    gate_local = _LocalShard.apply(gate, rows, rows)
    weight_local = None
    if weight is not None:
        # The weight's local gradient is this rank's rows' share: a Partial sum on the mesh
        # dims that shard rows, a shard of it where the columns are sharded.
        weight_local = _LocalShard.apply(weight, weight_placements(rows, last),
                                         dweight_placements(rows, last))
    y = reference.rms_norm_gated(
        x_local, gate_local, weight_local, eps=options.eps,
        zero_centered_gamma=options.zero_centered_gamma, activation=options.activation,
        norm_before_gate=options.norm_before_gate, group_size=options.group_size,
        rounding=options.rounding)
    return DTensor.from_local(y, mesh, rows, run_check=False, shape=x.shape,
                              stride=_contiguous_strides(x.shape))


class _LocalShard(torch.autograd.Function):
    """A DTensor's local shard in the given placements, whose gradient goes back as a DTensor in
    ``grad_placements``: what DTensor's dispatch does around the registered op, so both paths
    return gradients placed alike (a redistribute's own backward would move them back to the
    input's placements)."""

    @staticmethod
    def forward(ctx, t, placements, grad_placements):
        ctx.spec = (t.device_mesh, tuple(grad_placements), t.shape, t.stride())
        if tuple(t.placements) != tuple(placements):
            t = t.redistribute(t.device_mesh, placements)
        return t.to_local()

    @staticmethod
    def backward(ctx, grad):
        mesh, placements, shape, stride = ctx.spec
        return DTensor.from_local(grad, mesh, placements, run_check=False, shape=shape,
                                  stride=stride), None, None


def _contiguous_strides(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))
