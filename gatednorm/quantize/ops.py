"""``torch.ops.gatednorm.rms_norm_gated_fp8``: the quantized forward as a registered op.

Registered as ops.py registers the unquantized forward: ``triton_op`` (kernels through
``wrap_triton``) so torch.compile traces it without a graph break and CUDA graphs capture it;
under ``TRITON_INTERPRET=1`` a ``custom_op`` with a fake implementation. It has no autograd
formula: gradients reach the norm's inputs through the gradient anchor (autograd.py).
"""

from __future__ import annotations

import torch
from torch.library import custom_op, triton_op

from gatednorm.ops import INTERPRET
from gatednorm.quantize.formats import Float8Format
from gatednorm.quantize.launch import allocate_outputs, quantized_forward


def _format(scaling, power_of_two_scales, scale_layout, tensor_scale, quantize_rounded,
            columnwise) -> Float8Format:
    block_size = {"block": 128, "mxfp8": 32, "tensor": 0}[scaling]
    return Float8Format(scaling, block_size, power_of_two_scales, scale_layout,
                        scale=tensor_scale, quantize_rounded=quantize_rounded,
                        columnwise=columnwise)


def _forward(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor | None,
             tensor_scale: torch.Tensor | None, eps: float, zero_centered_gamma: bool,
             activation: str, norm_before_gate: bool, group_size: int, rounding: str,
             scaling: str, power_of_two_scales: bool, scale_layout: str,
             quantize_rounded: bool, columnwise: bool, store_rstd: bool
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                        torch.Tensor]:
    fmt = _format(scaling, power_of_two_scales, scale_layout, tensor_scale, quantize_rounded,
                  columnwise)
    return quantized_forward(
        x, gate, weight, tensor_scale, eps=eps, zero_centered_gamma=zero_centered_gamma,
        activation=activation, norm_before_gate=norm_before_gate, group_size=group_size,
        rounding=rounding, fmt=fmt, store_rstd=store_rstd, traceable=not INTERPRET)


def _forward_fake(x, gate, weight, tensor_scale, eps, zero_centered_gamma, activation,
                  norm_before_gate, group_size, rounding, scaling, power_of_two_scales,
                  scale_layout, quantize_rounded, columnwise, store_rstd):
    fmt = _format(scaling, power_of_two_scales, scale_layout, tensor_scale, quantize_rounded,
                  columnwise)
    return allocate_outputs(x, tensor_scale, group_size, fmt, store_rstd)


if INTERPRET:
    rms_norm_gated_fp8 = custom_op("gatednorm::rms_norm_gated_fp8", _forward, mutates_args=())
    rms_norm_gated_fp8.register_fake(_forward_fake)
else:
    rms_norm_gated_fp8 = triton_op("gatednorm::rms_norm_gated_fp8", _forward, mutates_args=())


def format_args(fmt: Float8Format) -> tuple:
    """The op's format arguments (scaling .. columnwise) of ``fmt``."""
    return (fmt.scaling, fmt.power_of_two_scales, fmt.scale_layout, fmt.quantize_rounded,
            fmt.columnwise)
