"""A source module's calling convention around the fused op.

:func:`forward_like_source` is what a converted module runs: the source's
``forward(hidden_states, gate=None)`` contract (the gate optional or not, its output dtype and
shape, broadcasting between x and gate) with the fused op, or any function with its arguments,
doing the arithmetic.
"""

from __future__ import annotations

import torch

from gatednorm import reference
from gatednorm.functional import rms_norm_gated
from gatednorm.integrations.shapes import GatedNormSpec


def _gate_operand(gate: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    # Every source computes act(gate.float()), so upcasting a gate that rms_norm_gated would
    # refuse (a bf16 gate with the fp32 scan output of the Mamba2 mixers) changes no bit.
    if gate.dtype in (x.dtype, torch.float32):
        return gate
    return gate.float()


def _weight_operand(weight: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor | None:
    # A bf16 weight times an fp32 normalized value is an fp32 product in every source, so an
    # fp32 x may take the weight upcast. Other mixes are left to rms_norm_gated's checks.
    if weight is None or weight.dtype in (x.dtype, torch.float32) or x.dtype != torch.float32:
        return weight
    return weight.float()


def _broadcast(x: torch.Tensor, gate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # The sources multiply by the gate with broadcasting; normalizing each broadcast copy of a
    # row gives the same values, so expanded (stride-0) views reproduce them exactly.
    if x.shape == gate.shape:
        return x, gate
    shape = torch.broadcast_shapes(x.shape, gate.shape)
    return x.expand(shape), gate.expand(shape)


def _squeeze_single_step(spec: GatedNormSpec, t: torch.Tensor) -> torch.Tensor:
    if spec.squeezes_single_step and t.dim() == 3 and t.shape[1] == 1:
        return t.squeeze(1)
    return t


def ungated(spec: GatedNormSpec, weight: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """The source's ``forward(x, gate=None)``: a plain RMSNorm in eager PyTorch."""
    normed = reference.rms_normalize(x.float(), spec.eps, spec.group_size)
    if weight is None:
        return normed.to(x.dtype)
    if spec.rounding == "hf":
        return weight * normed.to(x.dtype)
    return (weight * normed).to(x.dtype)


def forward_like_source(spec: GatedNormSpec, weight: torch.Tensor | None,
                        hidden_states: torch.Tensor, gate: torch.Tensor | None = None, *,
                        norm=rms_norm_gated) -> torch.Tensor:
    """``source.forward(hidden_states, gate)`` computed by ``norm`` (the fused op by default;
    :func:`gatednorm.reference.rms_norm_gated` for the eager composite).

    Raises:
        TypeError: gate=None where the source requires a gate.
    """
    x = hidden_states
    if gate is None:
        if not spec.gate_optional:
            raise TypeError(f"{spec.source} is called with a gate; got gate=None")
        return _squeeze_single_step(spec, ungated(spec, weight, x))
    if spec.norm_before_gate:
        # FalconH1 squeezes the normalized single step before the gate multiplies it.
        x = _squeeze_single_step(spec, x)
    x, gate = _broadcast(x, gate)
    y = norm(x, _gate_operand(gate, x), _weight_operand(weight, x), eps=spec.eps,
             activation=spec.activation, norm_before_gate=spec.norm_before_gate,
             group_size=spec.group_size, rounding=spec.rounding)
    if spec.promotes_output and weight is not None:
        y = y.to(torch.promote_types(x.dtype, weight.dtype))
    return y if spec.norm_before_gate else _squeeze_single_step(spec, y)
