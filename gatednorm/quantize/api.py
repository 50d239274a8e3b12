"""rms_norm_gated with an FP8 output: validate, pick the path, return a QuantizedOutput."""

from __future__ import annotations

import torch

from gatednorm import reference
from gatednorm.functional import rms_norm_gated
from gatednorm.options import GatedNormOptions
from gatednorm.quantize.autograd import GradientAnchor
from gatednorm.quantize.formats import Float8Format, as_format, check_format
from gatednorm.quantize.launch import fused_kernel_tiling, quantized_forward
from gatednorm.quantize.ops import format_args, rms_norm_gated_fp8
from gatednorm.quantize.reference import columnwise_quantize, reference_quantize
from gatednorm.quantize.result import QuantizedOutput


def quantized_rms_norm_gated(x: torch.Tensor, gate: torch.Tensor,
                             weight: torch.Tensor | None = None, *, quantize,
                             eps: float = 1e-6, zero_centered_gamma: bool = False,
                             activation: str = "silu", norm_before_gate: bool = True,
                             group_size: int | None = None,
                             rounding: str = "te") -> QuantizedOutput:
    """:func:`gatednorm.rms_norm_gated` with ``quantize`` given: the output quantized to FP8
    in one kernel.

    ``quantize`` is a :class:`Float8Format` or one of ``FORMAT_NAMES``; blocks run along x's
    last dim (quantize a [..., H, D] output as [..., H * D] by passing ``x.flatten(-2)`` and
    ``group_size=D``). By default the data and scales are exactly the reference quantizer's
    (:func:`gatednorm.quantize.reference_quantize`) of the y the unquantized op returns.
    Other arguments, dtypes and numerics as for :func:`gatednorm.rms_norm_gated`.

    Returns a :class:`QuantizedOutput`; when x, gate or weight requires grad, its anchor
    carries the gradient (dx, dgate, dweight are the unquantized op's for the same dy).
    """
    return rms_norm_gated(x, gate, weight, eps=eps, zero_centered_gamma=zero_centered_gamma,
                          activation=activation, norm_before_gate=norm_before_gate,
                          group_size=group_size, rounding=rounding, quantize=quantize)


def quantized_output(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor | None,
                     options: GatedNormOptions, quantize, fused: bool) -> QuantizedOutput:
    """The quantized exit of ``gatednorm.dispatch``: x, gate, weight and ``options`` (group_size
    resolved) already checked; ``fused`` says whether the kernels run."""
    fmt = as_format(quantize)
    check_format(fmt, x)
    group = options.group_size
    needs_grad = torch.is_grad_enabled() and (
        x.requires_grad or gate.requires_grad or (weight is not None and weight.requires_grad))
    if not fused:
        result = _reference_path(x, gate, weight, options, fmt, needs_grad)
    else:
        if (not fmt.quantize_rounded
                and fused_kernel_tiling(group, x.shape[-1] // group, fmt) is None):
            raise ValueError(
                f"quantize: quantize_rounded=False needs the fused kernel, which does not "
                f"cover group_size={group} with {fmt.block_size}-element blocks"
                f"{' and columnwise copies' if fmt.columnwise else ''}")
        result = _fused_path(x, gate, weight, options, fmt, needs_grad)
    return result


def _kernel_options(options: GatedNormOptions) -> dict:
    return dict(zero_centered_gamma=options.zero_centered_gamma, activation=options.activation,
                norm_before_gate=options.norm_before_gate, group_size=options.group_size,
                rounding=options.rounding)


def _fused_path(x, gate, weight, options: GatedNormOptions, fmt: Float8Format,
                needs_grad: bool) -> QuantizedOutput:
    if x.stride(-1) != 1:
        x = x.contiguous()
    if gate.stride(-1) != 1:
        gate = gate.contiguous()
    if weight is not None and weight.stride(-1) != 1:
        weight = weight.contiguous()
    if torch.compiler.is_compiling():
        # The registered op is functional: it returns the call's amax (_reported_amax maxes
        # it into the caller's buffer, a traced in-place op).
        data, scale, rstd, amax, col_data, col_scale = rms_norm_gated_fp8(
            x.detach(), gate.detach(), None if weight is None else weight.detach(), fmt.scale,
            *options.op_arguments(), *format_args(fmt), needs_grad)
    else:
        # Delayed scaling's eager kernel maxes into the caller's buffer itself.
        data, scale, rstd, amax, col_data, col_scale = quantized_forward(
            x.detach(), gate.detach(), None if weight is None else weight.detach(), fmt.scale,
            eps=options.eps, **_kernel_options(options), fmt=fmt, store_rstd=needs_grad,
            traceable=False, amax_out=None if fmt.scale is None else fmt.amax_out)
    anchor = GradientAnchor.apply(x, gate, weight, rstd, options) if needs_grad else None
    columnwise = (col_data, col_scale) if fmt.columnwise else (None, None)
    return QuantizedOutput(data, scale, *columnwise, _reported_amax(fmt, amax), fmt, anchor,
                           x.shape, x.dtype)


def _reported_amax(fmt: Float8Format, amax):
    """QuantizedOutput.amax: None for block formats; the call's own amax, or, where the caller
    gave a buffer, that buffer with the call's amax maxed into it (here, unless the kernel
    did it and returned an empty amax)."""
    if fmt.scaling != "tensor":
        return None
    if fmt.amax_out is None:
        return amax
    if amax.numel():
        torch.maximum(fmt.amax_out, amax, out=fmt.amax_out)
    return fmt.amax_out


def _reference_path(x, gate, weight, options: GatedNormOptions, fmt: Float8Format,
                    needs_grad: bool) -> QuantizedOutput:
    """CPU without the interpreter (and float64): the reference composite, then the
    reference quantizer; y itself is the anchor."""
    y = reference.rms_norm_gated(x, gate, weight, eps=options.eps, **_kernel_options(options))
    quantized = y.detach()
    if not fmt.quantize_rounded:
        # The composite in fp32: its final value before the rounding to x's dtype (for "te"
        # and "hf" without their intermediate 16-bit roundings).
        quantized = reference.rms_norm_gated(
            x.detach().float(), gate.detach().float(),
            None if weight is None else weight.detach().float(), eps=options.eps,
            **_kernel_options(options))
    data, scale, amax = reference_quantize(quantized, fmt)
    columnwise = columnwise_quantize(quantized, fmt) if fmt.columnwise else (None, None)
    return QuantizedOutput(data, scale, *columnwise, _reported_amax(fmt, amax), fmt,
                           y if needs_grad else None, x.shape, x.dtype)
