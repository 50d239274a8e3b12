"""fp8_linear: a consumer of the quantized output (the output projection), forward in FP8.

It shows the anchor pattern: the autograd Function takes the QuantizedOutput's anchor as an
input and returns the input gradient for it. Forward multiplies the FP8 input (1x128 blocks,
column-major scales) by the weight quantized in 128x128 blocks with
``torch.nn.functional.scaled_mm`` where the installed torch and GPU provide blockwise
scaling (torch >= 2.10, sm90), else with the dequantized operands in fp32 (the same values).
Backward is high precision, as FP8 recipes keep the data gradient: grad_input =
grad_out @ weight, grad_weight = grad_out^T @ dequantized input.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gatednorm.quantize.reference import dequantize, fp32_scale, nan_ignoring_abs, to_fp8
from gatednorm.quantize.result import QuantizedOutput

WEIGHT_BLOCK = 128


def quantize_weight_128x128(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(data [N, K] E4M3, scales [N / 128, K / 128] fp32) of a [N, K] weight, one
    ``amax / 448`` scale per 128x128 block (DeepGEMM's and TransformerEngine's weight blocks)."""
    n, k = weight.shape
    blocks = weight.float().reshape(n // WEIGHT_BLOCK, WEIGHT_BLOCK, k // WEIGHT_BLOCK,
                                    WEIGHT_BLOCK)
    scale = fp32_scale(nan_ignoring_abs(blocks).amax(dim=(1, 3)))
    data = to_fp8(blocks / scale[:, None, :, None]).reshape(n, k)
    return data, scale


def dequantize_weight_128x128(data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The fp32 [N, K] values of :func:`quantize_weight_128x128`'s output."""
    expanded = scale.repeat_interleave(WEIGHT_BLOCK, 0).repeat_interleave(WEIGHT_BLOCK, 1)
    return data.float() * expanded


def blockwise_scaled_mm_available(device: torch.device) -> bool:
    """Whether torch.nn.functional.scaled_mm takes 1x128 x 128x128 blockwise FP8 on ``device``."""
    scaling = getattr(F, "ScalingType", None)
    return (device.type == "cuda" and hasattr(F, "scaled_mm")
            and hasattr(scaling, "BlockWise1x128") and hasattr(scaling, "BlockWise128x128")
            and torch.cuda.get_device_capability(device) == (9, 0))


def blockwise_scaled_mm(data: torch.Tensor, scale: torch.Tensor, weight_data: torch.Tensor,
                        weight_scale: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """[M, N] = (data * scale) @ (weight_data * weight_scale)^T by cuBLAS's blockwise FP8
    GEMM. ``scale`` [M, K / 128] column-major with stride (1, M) (1x128, scale_layout
    "column" with M a multiple of 4); weight scales [N / 128, K / 128] from
    :func:`quantize_weight_128x128`."""
    k_blocks = weight_scale.shape[1]
    padded = -(-k_blocks // 4) * 4
    scale_b = torch.zeros((weight_scale.shape[0], padded), dtype=torch.float32,
                          device=weight_scale.device)
    scale_b[:, :k_blocks] = weight_scale
    return F.scaled_mm(data, weight_data.t(), scale, F.ScalingType.BlockWise1x128,
                       scale_b.t(), F.ScalingType.BlockWise128x128, output_dtype=out_dtype)


class _Float8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchor, data, scale, fmt, weight):
        weight_data, weight_scale = quantize_weight_128x128(weight.detach())
        if (fmt.scaling == "block" and fmt.scale_layout == "column" and data.shape[0] % 4 == 0
                and blockwise_scaled_mm_available(data.device)):
            out = blockwise_scaled_mm(data, scale, weight_data, weight_scale, weight.dtype)
        else:
            out = (dequantize(data, scale, fmt) @ dequantize_weight_128x128(
                weight_data, weight_scale).t()).to(weight.dtype)
        ctx.save_for_backward(data, scale, weight)
        ctx.fmt = fmt
        ctx.anchor_shape, ctx.anchor_dtype = anchor.shape, anchor.dtype
        return out.reshape(*anchor.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad_out):
        data, scale, weight = ctx.saved_tensors
        grad_rows = grad_out.reshape(-1, grad_out.shape[-1])
        grad_input = (grad_rows @ weight).to(ctx.anchor_dtype).reshape(ctx.anchor_shape)
        grad_weight = None
        if ctx.needs_input_grad[4]:
            grad_weight = (grad_rows.t() @ dequantize(data, scale, ctx.fmt, weight.dtype))
        return grad_input, None, None, None, grad_weight


def fp8_linear(quantized: QuantizedOutput, weight: torch.Tensor) -> torch.Tensor:
    """``y @ weight^T`` with y the norm's quantized output and the weight [N, K] quantized in
    128x128 blocks: [..., N] in the weight's dtype; differentiable to the norm's inputs
    (through the anchor) and to the weight. N and K must be multiples of 128."""
    if weight.dim() != 2 or weight.shape[1] != quantized.data.shape[1]:
        raise ValueError(f"weight must be [N, {quantized.data.shape[1]}], got "
                         f"{tuple(weight.shape)}")
    if weight.shape[0] % WEIGHT_BLOCK or weight.shape[1] % WEIGHT_BLOCK:
        raise ValueError(f"weight dims must be multiples of {WEIGHT_BLOCK}, got "
                         f"{tuple(weight.shape)}")
    anchor = quantized.anchor
    if anchor is None:
        anchor = torch.zeros((), dtype=quantized.dtype, device=quantized.data.device
                             ).expand(quantized.shape)
    return _Float8Linear.apply(anchor, quantized.data, quantized.scale, quantized.format, weight)
