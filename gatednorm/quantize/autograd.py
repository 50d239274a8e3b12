"""How a quantized output still trains the norm.

FP8 data cannot carry a gradient (and the gradient a consumer hands back is high precision),
so the quantized op's outputs carry none. Beside them :class:`GradientAnchor` returns a tensor
with y's shape and dtype that holds no memory (a zero expanded to y's shape); whatever
consumes the quantized output takes the anchor as an input and returns the gradient with
respect to y for it. The anchor's backward runs the unquantized op's backward
(``torch.ops.gatednorm.rms_norm_gated_bwd``) with the saved x, gate, weight and rstd, so dx,
dgate and dweight are those of the unquantized op for the same incoming gradient, bit for bit.
"""

from __future__ import annotations

import torch

import gatednorm.ops  # noqa: F401  (registers torch.ops.gatednorm.rms_norm_gated_bwd)
from gatednorm.quantize.reference import dequantize


class GradientAnchor(torch.autograd.Function):
    """anchor = GradientAnchor.apply(x, gate, weight, rstd, options): a memoryless [x.shape]
    tensor in x's dtype; ``options`` a GatedNormOptions with group_size resolved."""

    @staticmethod
    def forward(ctx, x, gate, weight, rstd, options):
        ctx.save_for_backward(x, gate, weight, rstd)
        ctx.options = options
        return x.new_zeros(()).expand(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x, gate, weight, rstd = ctx.saved_tensors
        dx, dgate, dweight = torch.ops.gatednorm.rms_norm_gated_bwd(
            dy.contiguous(), x, gate, weight, rstd, *ctx.options.op_arguments())
        return dx, dgate, (dweight if weight is not None else None), None, None


class Dequantize(torch.autograd.Function):
    """Dequantize.apply(anchor, data, scale, fmt, dtype): the dequantized values with the
    anchor's shape; the gradient goes to the anchor, in the anchor's dtype."""

    @staticmethod
    def forward(ctx, anchor, data, scale, fmt, dtype):
        ctx.anchor_dtype = anchor.dtype
        return dequantize(data, scale, fmt, dtype).reshape(anchor.shape)

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.anchor_dtype), None, None, None, None
