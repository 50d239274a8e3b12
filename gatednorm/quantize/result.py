"""QuantizedOutput: what the gated norm returns when asked for an FP8 output."""

from __future__ import annotations

from typing import NamedTuple

import torch

from gatednorm.quantize.formats import Float8Format
from gatednorm.quantize.reference import dequantize as _dequantize


class QuantizedOutput(NamedTuple):
    """The gated norm's output quantized to FP8.

    Fields:
        data: [tokens, K] ``torch.float8_e4m3fn`` (tokens: x's leading dims flattened).
        scale: dequantization scales (``y ~= data * scale`` per block) in the format's
            layout: fp32 [tokens, K / 128] row- or column-major, E8M0 [tokens, K / 32] or
            its swizzled flat storage, or fp32 [1] per tensor.
        columnwise_data: with ``format.columnwise``: [K, tokens] E4M3, blocks of 128 (MXFP8:
            32) consecutive tokens of a column; else None.
        columnwise_scale: with ``format.columnwise``: [K, ceil(tokens / block)], fp32 or
            E8M0, row-major; else None.
        amax: per-tensor formats: fp32 [1], the largest |y| of this call (NaN ignored);
            else None.
        format: the :class:`Float8Format`.
        anchor: the gradient anchor, or None when no gradient is needed: a tensor with y's
            shape and dtype that holds no memory (a broadcast zero), whose gradient is y's
            gradient. :meth:`dequantize` routes its gradient here; an FP8 consumer should
            take it as an input and return its input gradient for it.
        shape: y's shape (x's).
        dtype: y's dtype (x's).
    """

    data: torch.Tensor
    scale: torch.Tensor
    columnwise_data: torch.Tensor | None
    columnwise_scale: torch.Tensor | None
    amax: torch.Tensor | None
    format: Float8Format
    anchor: torch.Tensor | None
    shape: torch.Size
    dtype: torch.dtype

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``data * scale`` with y's shape, in ``dtype`` (default y's), computed in fp32.
        Differentiable: the gradient reaches the norm's inputs through the anchor."""
        dtype = self.dtype if dtype is None else dtype
        if self.anchor is None:
            return _dequantize(self.data, self.scale, self.format, dtype).reshape(self.shape)
        from gatednorm.quantize.autograd import Dequantize

        return Dequantize.apply(self.anchor, self.data, self.scale, self.format, dtype)
