"""FP8 output of the gated norm: the output projection's FP8 input written by the norm itself.

See docs/quantized.md. Formats: :func:`block_1x128` (Hopper, DeepGEMM / Float8BlockScaling),
:func:`mxfp8` (Blackwell), :func:`per_tensor` (delayed or current scaling).
"""

from gatednorm.quantize.api import quantized_rms_norm_gated
from gatednorm.quantize.formats import (
    FORMAT_NAMES,
    Float8Format,
    as_format,
    block_1x128,
    mxfp8,
    per_tensor,
)
from gatednorm.quantize.reference import (
    columnwise_quantize,
    dequantize,
    quantize_1x128,
    quantize_mxfp8,
    quantize_per_tensor,
    reference_quantize,
    swizzle_mxfp8_scales,
    unswizzle_mxfp8_scales,
)
from gatednorm.quantize.result import QuantizedOutput

__all__ = [
    "FORMAT_NAMES", "Float8Format", "QuantizedOutput", "as_format", "block_1x128",
    "columnwise_quantize",
    "dequantize", "mxfp8", "per_tensor", "quantize_1x128", "quantize_mxfp8",
    "quantize_per_tensor", "quantized_rms_norm_gated", "reference_quantize",
    "swizzle_mxfp8_scales", "unswizzle_mxfp8_scales",
]
