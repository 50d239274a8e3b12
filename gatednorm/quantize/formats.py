"""FP8 output formats of the gated norm: what the quantized output holds and how it is laid out.

Every format stores E4M3 data (``torch.float8_e4m3fn``, finite range +-448) and the
*dequantization* scale: ``y ~= data * scale``, the convention of ``torch._scaled_mm`` and
DeepGEMM. Blocks run along the last dim of the flattened ``[tokens, K]`` output (a
``[..., H, D]`` output is quantized as its ``[..., H * D]`` view).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
SCALINGS = ("block", "mxfp8", "tensor")
SCALE_LAYOUTS = ("row", "column", "swizzled")
# The cuBLAS / TMA tile of swizzled MXFP8 scales: 128 rows x 4 scale columns, 512 bytes.
SWIZZLE_ROWS = 128
SWIZZLE_COLS = 4
# Column-major 1x128 scales pad their token dim to a multiple of 4 (16 bytes, TMA alignment).
COLUMN_SCALE_ALIGN = 4


@dataclass(frozen=True, eq=False)
class Float8Format:
    """One FP8 output format; build it with :func:`block_1x128`, :func:`mxfp8` or
    :func:`per_tensor` (or pass one of the names in :data:`FORMAT_NAMES`).

    Attributes:
        scaling: ``"block"`` (fp32 scale per ``block_size`` elements), ``"mxfp8"`` (E8M0
            scale per 32 elements) or ``"tensor"`` (one fp32 scale).
        block_size: 128 for ``"block"``, 32 for ``"mxfp8"``, 0 for ``"tensor"``.
        power_of_two_scales: ``"block"`` only: round each scale up to a power of two
            (UE8M0-representable, TransformerEngine's Float8BlockScaling default).
        scale_layout: ``"row"`` ([tokens, K / block] row-major), ``"column"`` (the same
            shape, column-major with the token dim padded to a multiple of 4: DeepGEMM and
            blockwise ``scaled_mm``), ``"swizzled"`` (MXFP8 only: cuBLAS's 128x4 tiles).
        scale: ``"tensor"`` only: a given fp32 dequantization scale (one element; delayed
            scaling, one pass), or None for current scaling (two passes).
        amax_out: ``"tensor"`` only: an fp32 one-element buffer the call's amax is maxed
            into, in place (TransformerEngine's delayed-scaling amax: the running maximum
            over calls until the caller resets it; zero it first for this call's alone).
            Delayed scaling's kernel updates it itself, with no launch of its own.
        quantize_rounded: True (default): quantize exactly the y the unquantized op returns
            in x's dtype; False: quantize the fp32 value before that rounding.
        columnwise: ``"block"`` and ``"mxfp8"``: also write a columnwise copy for the
            weight-gradient GEMM: blocks of 128 (MXFP8: 32) consecutive tokens of a column,
            data transposed [K, tokens], scales [K, ceil(tokens / block)] row-major.
    """

    scaling: str
    block_size: int
    power_of_two_scales: bool = False
    scale_layout: str = "row"
    scale: torch.Tensor | None = None
    amax_out: torch.Tensor | None = None
    quantize_rounded: bool = True
    columnwise: bool = False

    def __post_init__(self):
        if self.scaling not in SCALINGS:
            raise ValueError(f"quantize: scaling must be one of {SCALINGS}, got {self.scaling!r}")
        expected_block = {"block": 128, "mxfp8": 32, "tensor": 0}[self.scaling]
        if self.block_size != expected_block:
            raise ValueError(f"quantize: {self.scaling!r} scaling takes block_size "
                             f"{expected_block}, got {self.block_size!r}")
        if self.scale_layout not in SCALE_LAYOUTS:
            raise ValueError(f"quantize: scale_layout must be one of {SCALE_LAYOUTS}, "
                             f"got {self.scale_layout!r}")
        if self.scale_layout == "swizzled" and self.scaling != "mxfp8":
            raise ValueError("quantize: scale_layout='swizzled' is MXFP8's (cuBLAS) layout")
        if self.scale_layout == "column" and self.scaling != "block":
            raise ValueError("quantize: scale_layout='column' is for 1x128 block scales")
        if self.power_of_two_scales and self.scaling != "block":
            raise ValueError("quantize: power_of_two_scales applies to 1x128 block scales "
                             "(MXFP8 scales are powers of two already)")
        if self.columnwise and self.scaling == "tensor":
            raise ValueError("quantize: columnwise copies are for block formats (a per-tensor "
                             "copy is the transpose of the data)")
        if self.scaling != "tensor" and (self.scale is not None or self.amax_out is not None):
            raise ValueError("quantize: scale / amax_out are per-tensor options")
        for name in ("scale", "amax_out"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, torch.Tensor)
                                      or value.dtype != torch.float32 or value.numel() != 1):
                raise TypeError(f"quantize: {name} must be a one-element float32 tensor, "
                                f"got {value!r}")

    @property
    def current_scaling(self) -> bool:
        """Per-tensor scaling whose scale comes from this call's own amax (two passes)."""
        return self.scaling == "tensor" and self.scale is None


def block_1x128(*, power_of_two_scales: bool = False, scale_layout: str = "row",
                columnwise: bool = False, quantize_rounded: bool = True) -> Float8Format:
    """1x128 blocks (Hopper, DeepGEMM / TransformerEngine Float8BlockScaling): one fp32
    scale per 128 consecutive elements of a row, ``amax / 448`` (rounded up to a power of
    two with ``power_of_two_scales``)."""
    return Float8Format("block", 128, power_of_two_scales, scale_layout,
                        quantize_rounded=quantize_rounded, columnwise=columnwise)


def mxfp8(*, swizzled: bool = False, columnwise: bool = False,
          quantize_rounded: bool = True) -> Float8Format:
    """MXFP8 (Blackwell): one E8M0 scale (``torch.float8_e8m0fnu``) per 32 elements, the
    power of two ``2**ceil(log2(amax / 448))``; scales plain [tokens, K / 32] or in cuBLAS's
    swizzled 128x4 tiles (``swizzled``)."""
    return Float8Format("mxfp8", 32, scale_layout="swizzled" if swizzled else "row",
                        quantize_rounded=quantize_rounded, columnwise=columnwise)


def per_tensor(scale: torch.Tensor | None = None, *, amax_out: torch.Tensor | None = None,
               quantize_rounded: bool = True) -> Float8Format:
    """One fp32 scale for the whole output: a given dequantization ``scale`` (delayed
    scaling: one pass), or None for current scaling (``amax / 448`` of this call: an amax
    pass, then the quantizing pass). The call's amax (the largest ``|y|``, NaN ignored) is
    returned as ``amax``; with ``amax_out`` (fp32, one element) it is maxed into that buffer
    in place instead, and ``amax`` is the buffer: the running maximum that a delayed-scaling
    recipe resets when it rolls its amax history."""
    return Float8Format("tensor", 0, scale=scale, amax_out=amax_out,
                        quantize_rounded=quantize_rounded)


FORMAT_NAMES = {
    "1x128": lambda: block_1x128(),
    "1x128_ue8m0": lambda: block_1x128(power_of_two_scales=True),
    "1x128_column": lambda: block_1x128(scale_layout="column"),
    "1x128_ue8m0_column": lambda: block_1x128(power_of_two_scales=True, scale_layout="column"),
    "1x128_columnwise": lambda: block_1x128(columnwise=True),
    "mxfp8": lambda: mxfp8(),
    "mxfp8_columnwise": lambda: mxfp8(columnwise=True),
    "mxfp8_swizzled": lambda: mxfp8(swizzled=True),
    "per_tensor": lambda: per_tensor(),
}


def as_format(quantize) -> Float8Format:
    """``quantize`` as a Float8Format (a name of FORMAT_NAMES or a Float8Format)."""
    if isinstance(quantize, Float8Format):
        return quantize
    if isinstance(quantize, str):
        if quantize not in FORMAT_NAMES:
            raise ValueError(f"quantize must be one of {sorted(FORMAT_NAMES)} or a "
                             f"Float8Format, got {quantize!r}")
        return FORMAT_NAMES[quantize]()
    raise TypeError(f"quantize must be a format name or a Float8Format, got "
                    f"{type(quantize).__name__}")


def check_format(fmt: Float8Format, x: torch.Tensor) -> None:
    """Raise ValueError when ``fmt`` cannot quantize an output shaped like ``x``."""
    if fmt.block_size and x.shape[-1] % fmt.block_size:
        raise ValueError(f"quantize: the last dim of x ({x.shape[-1]}) must be a multiple of "
                         f"the {fmt.block_size}-element block")
    if (fmt.scale_layout == "swizzled" and x.dtype == torch.float32
            and (x.numel() // max(x.shape[-1], 1)) % SWIZZLE_ROWS):
        raise ValueError("quantize: swizzled MXFP8 scales of a float32 x need a token count "
                         f"that is a multiple of {SWIZZLE_ROWS}")
    for name in ("scale", "amax_out"):
        value = getattr(fmt, name)
        if value is not None and value.device != x.device:
            raise ValueError(f"quantize: {name} is on {value.device}, x on {x.device}")


def scale_shape(fmt: Float8Format, rows: int, k: int) -> tuple[int, ...]:
    """Shape of the logical scale tensor (before any swizzle) of a [rows, k] output."""
    if fmt.scaling == "tensor":
        return (1,)
    return (rows, k // fmt.block_size)


def swizzled_size(rows: int, scale_cols: int) -> int:
    """Bytes of swizzled MXFP8 scales: rows padded to 128, scale columns to 4."""
    padded_rows = -(-rows // SWIZZLE_ROWS) * SWIZZLE_ROWS
    padded_cols = -(-scale_cols // SWIZZLE_COLS) * SWIZZLE_COLS
    return padded_rows * padded_cols


def allocate_columnwise(fmt: Float8Format, rows, k: int, device):
    """(data [k, rows] E4M3, scales [k, ceil(rows / block)]) of the columnwise copy, or two
    empty tensors when ``fmt`` has none."""
    if not fmt.columnwise:
        empty = torch.empty((0,), dtype=FP8_DTYPE, device=device)
        return empty, torch.empty((0,), dtype=torch.float32, device=device)
    token_blocks = -(-rows // fmt.block_size)
    scale_dtype = torch.float8_e8m0fnu if fmt.scaling == "mxfp8" else torch.float32
    return (torch.empty((k, rows), dtype=FP8_DTYPE, device=device),
            torch.empty((k, token_blocks), dtype=scale_dtype, device=device))


def allocate_scales(fmt: Float8Format, rows, k: int, device) -> torch.Tensor:
    """The scale output of a [rows, k] quantized output, in ``fmt``'s layout.

    row: [rows, k/block] contiguous; column: [rows, k/128] with strides (1, padded rows);
    swizzled: flat uint8-sized E8M0 storage of :func:`swizzled_size` bytes (padding zeroed);
    tensor: [1]."""
    if fmt.scaling == "tensor":
        return torch.empty((1,), dtype=torch.float32, device=device)
    cols = k // fmt.block_size
    if fmt.scaling == "mxfp8":
        if fmt.scale_layout == "swizzled":
            return torch.zeros((swizzled_size(rows, cols),), dtype=torch.uint8,
                               device=device).view(torch.float8_e8m0fnu)
        return torch.empty((rows, cols), dtype=torch.float8_e8m0fnu, device=device)
    if fmt.scale_layout == "column":
        padded = -(-rows // COLUMN_SCALE_ALIGN) * COLUMN_SCALE_ALIGN
        return torch.empty((cols, padded), dtype=torch.float32, device=device)[:, :rows].t()
    return torch.empty((rows, cols), dtype=torch.float32, device=device)
