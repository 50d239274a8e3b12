"""The reference quantizers (the spec of the FP8 output) on hand-made blocks, and the formats'
argument checks."""

import pytest
import torch

from gatednorm.quantize import (
    FORMAT_NAMES,
    columnwise_quantize,
    as_format,
    block_1x128,
    dequantize,
    mxfp8,
    per_tensor,
    quantize_1x128,
    quantize_mxfp8,
    quantize_per_tensor,
    reference_quantize,
    swizzle_mxfp8_scales,
    unswizzle_mxfp8_scales,
)
from gatednorm.quantize.formats import check_format

FP8 = torch.float8_e4m3fn


def codes(t):
    return t.view(torch.uint8)


def one_block(values, size=128):
    """A [1, size] fp32 row holding ``values`` then zeros."""
    row = torch.zeros(1, size)
    row[0, :len(values)] = torch.tensor(values, dtype=torch.float32)
    return row


def test_all_zero_block_takes_scale_one_and_zero_data():
    data, scale = quantize_1x128(torch.zeros(2, 256))
    assert torch.equal(scale, torch.ones(2, 2))
    assert torch.equal(codes(data), torch.zeros(2, 256, dtype=torch.uint8))


def test_all_zero_mxfp8_block_takes_the_smallest_e8m0_code():
    data, scale = quantize_mxfp8(torch.zeros(1, 32))
    assert codes(scale).item() == 0
    assert torch.equal(codes(data), torch.zeros(1, 32, dtype=torch.uint8))


def test_block_max_maps_to_448_and_scale_is_amax_over_448():
    row = one_block([3.0, -1.5, 0.25])
    data, scale = quantize_1x128(row)
    assert scale.item() == torch.tensor(3.0 / 448, dtype=torch.float32).item()
    assert data[0, 0].float().item() == 448.0
    assert torch.equal(data.float() * scale, (row / scale).to(FP8).float() * scale)


def test_given_per_tensor_scale_saturates_at_448():
    data, _, amax = quantize_per_tensor(torch.tensor([[1e6, -1e6, 1.0]]), torch.ones(1))
    assert data.float().tolist() == [[448.0, -448.0, 1.0]]
    assert amax.item() == 1e6


def test_subnormal_results_round_to_nearest_even_multiples_of_2_to_minus_9():
    # With amax 448 the scale is 1: values below 2**-6 are E4M3 subnormals.
    row = one_block([448.0, 2.0 ** -9, 1.5 * 2.0 ** -9, 2.5 * 2.0 ** -9, 2.0 ** -11])
    data, scale = quantize_1x128(row)
    assert scale.item() == 1.0
    assert data[0, :5].float().tolist() == [448.0, 2.0 ** -9, 2 * 2.0 ** -9, 2 * 2.0 ** -9, 0.0]


@pytest.mark.parametrize("power_of_two", [False, True])
def test_a_block_whose_amax_over_448_underflows_takes_the_smallest_scale(power_of_two):
    # amax = 7 * 2**-149 (fp32 y only): amax / 448 rounds to 0; the scale is the smallest
    # positive fp32 (a power of two: 2**-126 when rounded up), not 0, whose quotients would
    # all saturate.
    tiny = 2.0**-149
    data, scale = quantize_1x128(one_block([7 * tiny, -2 * tiny, tiny]),
                                 power_of_two_scales=power_of_two)
    expected_scale = 2.0**-126 if power_of_two else tiny
    assert scale.tolist() == [[expected_scale]]
    expected = torch.tensor([7.0, -2.0, 1.0]) * (tiny / expected_scale)
    assert torch.equal(data[0, :3].float(), expected.to(FP8).float())
    _, current, _ = reference_quantize(one_block([7 * tiny]), per_tensor())
    assert current.tolist() == [tiny]


def test_nan_gives_the_nan_code_and_is_ignored_by_the_scale():
    data, scale = quantize_1x128(one_block([float("nan"), 2.0, -float("nan")]))
    assert scale.item() == torch.tensor(2.0 / 448, dtype=torch.float32).item()
    assert codes(data)[0, :3].tolist() == [0x7F, 0x7E, 0x7F]


def test_infinity_gives_scale_one_and_saturated_data():
    data, scale = quantize_1x128(one_block([float("inf"), -float("inf"), 3.0]))
    assert scale.item() == 1.0
    assert data[0, :3].float().tolist() == [448.0, -448.0, 3.0]
    mx_data, mx_scale = quantize_mxfp8(one_block([float("inf"), 1.0], 32))
    assert codes(mx_scale).item() == 254
    assert mx_data[0, 0].float().item() == 448.0


def test_negative_zero_keeps_its_sign():
    data, _ = quantize_1x128(one_block([-0.0, 1.0]))
    assert codes(data)[0, 0].item() == 0x80
    mx_data, _ = quantize_mxfp8(one_block([-0.0, 1.0], 32))
    assert codes(mx_data)[0, 0].item() == 0x80


@pytest.mark.parametrize("amax", [448.0, 449.0, 1.0, 3.0e-3, 1e30])
def test_power_of_two_scales_round_up_so_amax_fits(amax):
    data, scale = quantize_1x128(one_block([amax]), power_of_two_scales=True)
    mantissa, exponent = torch.frexp(scale)
    assert mantissa.item() == 0.5
    assert amax / scale.item() <= 448 and amax / scale.item() > 224
    assert data[0, 0].float().item() == (torch.tensor(amax) / scale).to(FP8).float().item()
    _, mx_scale = quantize_mxfp8(one_block([amax], 32))
    assert 2.0 ** (codes(mx_scale).item() - 127) == scale.item()


def test_mxfp8_scale_is_the_e8m0_power_of_two_amax_fits_under():
    x = torch.randn(4, 64) * 10
    data, scale = quantize_mxfp8(x)
    assert scale.dtype == torch.float8_e8m0fnu and scale.shape == (4, 2)
    exponent = codes(scale).int() - 127
    amax = x.abs().unflatten(-1, (2, 32)).amax(-1)
    assert torch.all(amax / 2.0 ** exponent <= 448)
    assert torch.all(amax / 2.0 ** (exponent - 1) > 448)


def test_a_block_straddling_two_heads_is_one_block_of_the_flattened_row():
    # [tokens, H = 2, D = 64] quantized as [tokens, 128]: one scale across both heads.
    y = torch.randn(3, 2, 64)
    y[:, 1] *= 100
    data, scale = quantize_1x128(y.flatten(-2))
    assert scale.shape == (3, 1)
    assert torch.equal(scale[:, 0], y.abs().flatten(-2).amax(-1) / 448.0)


def test_swizzled_scales_follow_the_cublas_128x4_tile_layout():
    rows, cols = 200, 6
    plain = torch.randint(0, 255, (rows, cols), dtype=torch.uint8).view(torch.float8_e8m0fnu)
    swizzled = codes(swizzle_mxfp8_scales(plain))
    assert swizzled.numel() == 256 * 8
    for r, c in [(0, 0), (1, 0), (31, 3), (32, 0), (127, 5), (128, 1), (199, 5)]:
        tile = (r // 128) * 2 + c // 4
        offset = tile * 512 + (r % 32) * 16 + (r % 128) // 32 * 4 + c % 4
        assert swizzled[offset] == codes(plain)[r, c]
    assert torch.equal(codes(unswizzle_mxfp8_scales(swizzle_mxfp8_scales(plain), rows, cols)),
                       codes(plain))


def test_column_major_scales_are_the_row_major_values_with_token_stride_one():
    y = torch.randn(6, 256)
    _, row_major = quantize_1x128(y)
    _, column_major, _ = reference_quantize(y, block_1x128(scale_layout="column"))
    assert column_major.stride() == (1, 8)
    assert torch.equal(column_major, row_major)


@pytest.mark.parametrize("name", sorted(FORMAT_NAMES))
def test_dequantize_is_within_half_an_fp8_step(name):
    y = torch.randn(130, 256) * 4
    fmt = as_format(name)
    data, scale, _ = reference_quantize(y, fmt)
    error = (dequantize(data, scale, fmt) - y).abs()
    # E4M3 keeps 3 mantissa bits: a relative step of 2**-3, half of it after rounding; the
    # largest scale of the block bounds the absolute error of its small values.
    blocks = y.abs().unflatten(-1, (-1, fmt.block_size or 256)).amax(-1, keepdim=True)
    bound = (blocks * 2.0 ** -3).expand(-1, -1, fmt.block_size or 256).flatten(-2)
    assert torch.all(error <= bound)


def test_per_tensor_current_scaling_uses_amax_over_448():
    y = torch.randn(8, 64)
    data, scale, amax = quantize_per_tensor(y)
    assert amax.item() == y.abs().max().item()
    assert scale.item() == (amax / 448).item()
    assert data.float().abs().max().item() == 448.0


@pytest.mark.parametrize("make, message", [
    (lambda: as_format("fp8_e5m2"), "quantize must be one of"),
    (lambda: as_format(3), "quantize must be a format name"),
    (lambda: mxfp8().__class__("mxfp8", 128), "block_size 32"),
    (lambda: block_1x128(scale_layout="swizzled"), "swizzled"),
    (lambda: per_tensor(torch.ones(2)), "one-element float32"),
    (lambda: block_1x128(scale_layout="diagonal"), "scale_layout must be"),
])
def test_bad_formats_raise_naming_the_argument(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


def test_k_not_a_multiple_of_the_block_raises():
    with pytest.raises(ValueError, match="multiple of the 128-element block"):
        check_format(block_1x128(), torch.zeros(4, 192))


def test_fp32_swizzled_mxfp8_needs_rows_in_multiples_of_128():
    with pytest.raises(ValueError, match="multiple of 128"):
        check_format(mxfp8(swizzled=True), torch.zeros(100, 64))
    check_format(mxfp8(swizzled=True), torch.zeros(128, 64))
    check_format(mxfp8(swizzled=True), torch.zeros(100, 64, dtype=torch.bfloat16))


@pytest.mark.parametrize("name", ["1x128_columnwise", "mxfp8_columnwise"])
def test_columnwise_copy_is_the_rowwise_quantization_of_the_transpose(name):
    fmt = as_format(name)
    y = torch.randn(2 * fmt.block_size + 5, 64)
    data, scale = columnwise_quantize(y, fmt)
    assert data.shape == (64, y.shape[0]) and scale.shape == (64, 3)
    full_blocks = y[:2 * fmt.block_size].t().contiguous()
    expected_data, expected_scale, _ = reference_quantize(full_blocks, fmt)
    assert torch.equal(codes(data[:, :2 * fmt.block_size]), codes(expected_data))
    assert torch.equal(scale[:, :2].view(torch.uint8), expected_scale.view(torch.uint8))
    # The partial last block: the amax of its 5 tokens.
    tail_data, tail_scale, _ = reference_quantize(
        torch.cat([y[2 * fmt.block_size:].t(), torch.zeros(64, fmt.block_size - 5)], 1), fmt)
    assert torch.equal(scale[:, 2:].view(torch.uint8), tail_scale.view(torch.uint8))
    assert torch.equal(codes(data[:, 2 * fmt.block_size:]), codes(tail_data[:, :5]))


def test_per_tensor_columnwise_is_rejected():
    with pytest.raises(ValueError, match="columnwise copies are for block formats"):
        per_tensor().__class__("tensor", 0, columnwise=True)


def test_mismatches_names_every_field_that_differs():
    from gatednorm.quantize import QuantizedOutput
    from gatednorm.quantize.reference import mismatches

    y = torch.randn(4, 256)
    fmt = as_format("1x128_columnwise")
    data, scale, _ = reference_quantize(y, fmt)
    column_data, column_scale = columnwise_quantize(y, fmt)
    result = QuantizedOutput(data.clone(), scale.clone(), column_data, column_scale, None, fmt,
                             None, y.shape, y.dtype)
    assert mismatches(result, y) == []
    codes(result.data)[1, 7] ^= 1
    result.scale[0, 0] *= 2
    assert mismatches(result, y) == ["data", "scale"]
