"""Reference quantizers: plain torch ops, the specification the fused kernels reproduce bit for bit.

Rules shared by every format (``s`` is the dequantization scale, ``y ~= data * s``):

- amax is the largest ``|y|`` of a block (or the tensor), NaN ignored; an infinity counts.
- fp32 scales (1x128 blocks, per-tensor current scaling): ``s = amax / 448``, correctly
  rounded, or 2**-149 (the smallest positive fp32) where that quotient rounds to 0 (amax below
  448 * 2**-150: fp32 y only); ``s = 1`` where amax is 0 or infinite (TransformerEngine's
  rule). With
  ``power_of_two_scales`` s is then rounded up to a power of two (exactly, from its bits).
- E8M0 scales (MXFP8): ``s = 2**e`` with e the exponent of ``amax / 448`` rounded up, so
  that ``amax / s <= 448`` (the rule of TransformerEngine and cuBLAS); amax = 0 gives the
  smallest code, 2**-127; e is capped at 2**127.
- data = ``y / s`` (``y * 2**-e`` for E8M0) saturated to +-448, rounded to nearest even
  into E4M3 (subnormals included); NaN gives the code 0x7F, -0.0 stays -0.0.
"""

from __future__ import annotations

import torch

from gatednorm.quantize.formats import (
    COLUMN_SCALE_ALIGN,
    FP8_DTYPE,
    FP8_MAX,
    SWIZZLE_COLS,
    SWIZZLE_ROWS,
    Float8Format,
    as_format,
)

_NAN_CODE = 0x7F
_EXPONENT_MASK = 0x7F800000
_MANTISSA_MASK = 0x007FFFFF
_E8M0_MAX = 254
# The smallest positive fp32 (a subnormal): the least fp32 scale, where amax / 448 would round
# to 0 and every nonzero y of the block divide to an infinity.
_SMALLEST_FP32 = 2.0**-149


def nan_ignoring_abs(y: torch.Tensor) -> torch.Tensor:
    """|y| in fp32 with NaN replaced by 0 (amax ignores NaN)."""
    y = y.float()
    return torch.where(torch.isnan(y), torch.zeros_like(y), y.abs())


def over_fp8_max(amax: torch.Tensor) -> torch.Tensor:
    """``amax / 448`` correctly rounded on every device. The divisor is a tensor on amax's
    device: PyTorch's CUDA division by a Python number multiplies by its reciprocal instead,
    which is one fp32 rounding off for some amax (and the kernels divide)."""
    return amax / torch.full((), FP8_MAX, dtype=amax.dtype, device=amax.device)


def fp32_scale(amax: torch.Tensor, power_of_two: bool = False) -> torch.Tensor:
    """``amax / 448``, at least 2**-149 (1 where amax is 0 or infinite), optionally rounded up
    to a power of two."""
    scale = over_fp8_max(amax).clamp(min=_SMALLEST_FP32)
    scale = torch.where((amax > 0) & torch.isfinite(amax), scale, torch.ones_like(scale))
    if power_of_two:
        bits = scale.view(torch.int32)
        bits = (bits + _MANTISSA_MASK) & _EXPONENT_MASK
        scale = bits.view(torch.float32)
    return scale


def e8m0_exponent(amax: torch.Tensor) -> torch.Tensor:
    """The biased E8M0 exponent (int32, 0..254) of ``2**ceil(log2(amax / 448))``."""
    bits = over_fp8_max(amax).view(torch.int32)
    exponent = ((bits + _MANTISSA_MASK) & _EXPONENT_MASK) >> 23
    return exponent.clamp(max=_E8M0_MAX)


def e8m0_inverse(exponent: torch.Tensor) -> torch.Tensor:
    """2**(127 - e) for e in 0..253, 2**-126 for e = 254 (2**-127 is not a normal fp32;
    :func:`_last_halving` supplies the last factor 1/2): exact power-of-two products."""
    return ((254 - exponent).clamp(min=1) << 23).view(torch.float32)


def _last_halving(exponent: torch.Tensor) -> torch.Tensor:
    return torch.where(exponent == _E8M0_MAX, 0.5, 1.0)


def to_fp8(values: torch.Tensor) -> torch.Tensor:
    """fp32 ``values`` saturated to +-448 and rounded into E4M3; NaN -> 0x7F."""
    nan = torch.isnan(values)
    data = values.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).view(torch.uint8)
    return torch.where(nan, torch.full_like(data, _NAN_CODE), data).view(FP8_DTYPE)


def _rows(y: torch.Tensor) -> torch.Tensor:
    return y.reshape(-1, y.shape[-1])


def quantize_1x128(y: torch.Tensor, *, power_of_two_scales: bool = False,
                   block_size: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """(data [tokens, K] E4M3, scales [tokens, K / 128] fp32 row-major) of ``y`` [..., K]."""
    rows = _rows(y).float()
    blocks = rows.unflatten(-1, (-1, block_size))
    scale = fp32_scale(nan_ignoring_abs(blocks).amax(-1), power_of_two_scales)
    return to_fp8(blocks / scale[..., None]).flatten(-2), scale


def quantize_mxfp8(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(data [tokens, K] E4M3, scales [tokens, K / 32] float8_e8m0fnu) of ``y`` [..., K]."""
    blocks = _rows(y).float().unflatten(-1, (-1, 32))
    exponent = e8m0_exponent(nan_ignoring_abs(blocks).amax(-1))
    data = to_fp8(blocks * e8m0_inverse(exponent)[..., None] * _last_halving(exponent)[..., None]
                  ).flatten(-2)
    return data, exponent.to(torch.uint8).view(torch.float8_e8m0fnu)


def quantize_per_tensor(y: torch.Tensor, scale: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(data [tokens, K] E4M3, scale [1] fp32, amax [1] fp32) of ``y``: with the given
    dequantization ``scale`` (delayed scaling), or ``amax / 448`` (current scaling)."""
    rows = _rows(y).float()
    amax = nan_ignoring_abs(rows).amax().reshape(1) if rows.numel() else rows.new_zeros(1)
    if scale is None:
        scale = fp32_scale(amax)
    scale = scale.reshape(1).float()
    return to_fp8(rows / scale), scale, amax


def swizzle_mxfp8_scales(scales: torch.Tensor) -> torch.Tensor:
    """[rows, cols] E8M0 scales in cuBLAS's layout: 128x4 tiles in row-major tile order,
    each tile stored as ``[32][4 row groups][4 cols]``; rows padded to 128 and cols to 4
    with zeros. Returns the flat storage."""
    rows, cols = scales.shape
    padded_rows = -(-rows // SWIZZLE_ROWS) * SWIZZLE_ROWS
    padded_cols = -(-cols // SWIZZLE_COLS) * SWIZZLE_COLS
    padded = torch.zeros((padded_rows, padded_cols), dtype=torch.uint8, device=scales.device)
    padded[:rows, :cols] = scales.view(torch.uint8)
    tiles = padded.view(padded_rows // 128, 4, 32, padded_cols // 4, 4)
    # (tile row, row group, row in group, tile col, col) -> (tile row, tile col, row in group,
    # row group, col)
    return tiles.permute(0, 3, 2, 1, 4).reshape(-1).view(torch.float8_e8m0fnu)


def unswizzle_mxfp8_scales(swizzled: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of :func:`swizzle_mxfp8_scales`: the [rows, cols] E8M0 scales."""
    padded_rows = -(-rows // SWIZZLE_ROWS) * SWIZZLE_ROWS
    padded_cols = -(-cols // SWIZZLE_COLS) * SWIZZLE_COLS
    tiles = swizzled.view(torch.uint8).view(padded_rows // 128, padded_cols // 4, 32, 4, 4)
    plain = tiles.permute(0, 3, 2, 1, 4).reshape(padded_rows, padded_cols)
    return plain[:rows, :cols].contiguous().view(torch.float8_e8m0fnu)


def column_major(scales: torch.Tensor) -> torch.Tensor:
    """[rows, cols] fp32 scales as the same logical tensor stored column-major, the token
    dim padded to a multiple of 4 (DeepGEMM / blockwise ``scaled_mm``)."""
    rows, cols = scales.shape
    padded = -(-rows // COLUMN_SCALE_ALIGN) * COLUMN_SCALE_ALIGN
    storage = torch.zeros((cols, padded), dtype=scales.dtype, device=scales.device)
    storage[:, :rows] = scales.t()
    return storage[:, :rows].t()


def reference_quantize(y: torch.Tensor, quantize) -> tuple[torch.Tensor, torch.Tensor,
                                                            torch.Tensor | None]:
    """(data, scales, amax) of ``y`` [..., K] in the format ``quantize`` (a name or a
    Float8Format), scales in the format's layout; amax only for per-tensor formats."""
    fmt = as_format(quantize)
    if fmt.scaling == "tensor":
        return quantize_per_tensor(y, fmt.scale)
    if fmt.scaling == "mxfp8":
        data, scales = quantize_mxfp8(y)
        if fmt.scale_layout == "swizzled":
            scales = swizzle_mxfp8_scales(scales)
        return data, scales, None
    data, scales = quantize_1x128(y, power_of_two_scales=fmt.power_of_two_scales)
    if fmt.scale_layout == "column":
        scales = column_major(scales)
    return data, scales, None


def columnwise_quantize(y: torch.Tensor, quantize) -> tuple[torch.Tensor, torch.Tensor]:
    """The columnwise copy of ``y`` [..., K] (1x128 or MXFP8 formats): the rowwise
    quantization of y^T [K, tokens], a partial last token block padded with zeros (which
    leave its amax unchanged). Returns (data [K, tokens], scales [K, ceil(tokens / block)])."""
    fmt = as_format(quantize)
    rows = _rows(y).float()
    tokens = rows.shape[0]
    padded = -(-tokens // fmt.block_size) * fmt.block_size
    transposed = torch.zeros((rows.shape[1], padded), dtype=torch.float32, device=y.device)
    transposed[:, :tokens] = rows.t()
    if fmt.scaling == "mxfp8":
        data, scales = quantize_mxfp8(transposed)
    else:
        data, scales = quantize_1x128(transposed, power_of_two_scales=fmt.power_of_two_scales)
    return data[:, :tokens].contiguous(), scales


def dequantize(data: torch.Tensor, scales: torch.Tensor, fmt: Float8Format,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``data * scale`` per block, [tokens, K] in ``dtype`` (computed in fp32)."""
    values = data.float()
    if fmt.scaling == "tensor":
        return (values * scales.float()).to(dtype)
    rows, k = values.shape
    if fmt.scaling == "mxfp8":
        if fmt.scale_layout == "swizzled":
            scales = unswizzle_mxfp8_scales(scales, rows, k // 32)
        exponent = scales.view(torch.uint8).int()
        # 2**(e - 127); e = 0 (subnormal 2**-127) has no exponent-only fp32 encoding.
        scale = torch.where(exponent == 0, torch.full_like(exponent, 1, dtype=torch.float32)
                            * 2.0 ** -127, (exponent << 23).view(torch.float32))
    else:
        scale = scales.float()
    blocks = values.unflatten(-1, (-1, fmt.block_size)) * scale[..., None]
    return blocks.flatten(-2).to(dtype)


def mismatches(result, y: torch.Tensor) -> list[str]:
    """The fields of ``result`` (a QuantizedOutput) that differ, bit for bit, from the
    reference quantization of ``y`` in ``result.format`` (data, scale and its strides, amax,
    the columnwise copy): an empty list when the output is exactly the spec's."""
    fmt = result.format
    data, scale, amax = reference_quantize(y, fmt)
    expected = {"data": data, "scale": scale, "amax": amax}
    if fmt.columnwise:
        expected["columnwise_data"], expected["columnwise_scale"] = columnwise_quantize(y, fmt)
    wrong = [name for name, want in expected.items()
             if want is not None and not _same_bits(getattr(result, name), want)]
    if result.scale.stride() != scale.stride():
        wrong.append("scale strides")
    if not fmt.columnwise and (result.columnwise_data is not None
                               or result.columnwise_scale is not None):
        wrong.append("columnwise (not asked for)")
    return wrong


def _same_bits(got: torch.Tensor, want: torch.Tensor) -> bool:
    return (got.dtype == want.dtype and got.shape == want.shape
            and torch.equal(got.contiguous().view(torch.uint8),
                            want.contiguous().view(torch.uint8)))
