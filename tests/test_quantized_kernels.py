"""The fused quantized forward through the Triton interpreter: data, scales and amax equal
the reference quantizer's of the y the unquantized op returns, bit for bit."""

import dataclasses
import itertools

import pytest
import torch

import gatednorm
from gatednorm import ops
from gatednorm.quantize import (
    FORMAT_NAMES,
    as_format,
    block_1x128,
    mxfp8,
    per_tensor,
)
from gatednorm.quantize.launch import (
    BLOCK_FP32,
    BLOCK_POWER_OF_TWO,
    MXFP8_E8M0,
    TENSOR_CURRENT,
    TENSOR_GIVEN,
    columnwise_launch,
    few_rows_tiling,
    fused_plan,
    fused_scale_words,
    fused_tiling,
    rowwise_launch,
    stores_scale_words,
)
from gatednorm.quantize.reference import mismatches
from quantized_cases import blocks_with_maxima, scale_rule_edges

pytestmark = pytest.mark.skipif(not ops.INTERPRET, reason="CPU kernel tests need TRITON_INTERPRET=1")

ROUNDINGS = ("te", "fp32", "hf")
DTYPES = (torch.float16, torch.bfloat16)
# (x shape, group size): GDN heads as [tokens, H * D] with D = 128 (blocks nest in groups)
# and D = 64 (a 128-block straddles two heads), Mamba2-like 640-wide groups (head 512 + tail
# 128 tiles), a 96-wide group (head 64 + tail 32: MXFP8 nests, 1x128 takes the unfused path),
# a whole row of 256, and K = 480 (a multiple of MXFP8's 32, not of 128: the last 128-wide
# tile of the unfused columnwise kernel is partial), and groups of 48 (no format's block
# nests with them: the norm, then the quantize kernels). Token counts leave a partial block
# of tokens for the columnwise copy.
SHAPES = [((40, 256), 128), ((130, 256), 64), ((33, 1280), 640), ((6, 384), 96),
          ((5, 256), None), ((20, 480), 96), ((9, 384), 48)]


def codes(t):
    return t.view(torch.uint8)


def inputs(shape, dtype, weight_dtype=None):
    x = torch.randn(shape, dtype=dtype)
    gate = torch.randn(shape, dtype=dtype) * 2
    weight = 1 + 0.5 * torch.randn(shape[-1], dtype=weight_dtype or dtype)
    return x, gate, weight


def assert_matches_reference_of_op_output(result, y):
    assert mismatches(result, y) == []


def poisoned(monkeypatch):
    """Make every empty output NaN-filled (uint8 0x7F: the NaN code) so unwritten elements
    cannot pass."""
    real_empty = torch.empty

    def empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        if t.dtype.is_floating_point:
            t.view(torch.uint8).fill_(0x7F) if t.element_size() == 1 else t.fill_(float("nan"))
        return t

    monkeypatch.setattr(torch, "empty", empty)


@pytest.mark.parametrize("name", sorted(FORMAT_NAMES))
@pytest.mark.parametrize("norm_before_gate, rounding",
                         list(itertools.product((True, False), ROUNDINGS)))
def test_every_format_order_and_rounding_matches_the_reference_quantizer(
        name, norm_before_gate, rounding, monkeypatch):
    index = sorted(FORMAT_NAMES).index(name) + ROUNDINGS.index(rounding)
    dtype = DTYPES[index % 2]
    activation = ("silu", "sigmoid")[(index // 2) % 2]
    x, gate, weight = inputs((8, 256), dtype)
    poisoned(monkeypatch)
    result = gatednorm.rms_norm_gated(
        x, gate, weight, quantize=name, group_size=128, activation=activation,
        norm_before_gate=norm_before_gate, rounding=rounding)
    monkeypatch.undo()
    y = gatednorm.rms_norm_gated(x, gate, weight, group_size=128, activation=activation,
                                 norm_before_gate=norm_before_gate, rounding=rounding)
    assert_matches_reference_of_op_output(result, y)


@pytest.mark.parametrize("shape, group", SHAPES)
@pytest.mark.parametrize("fmt", [block_1x128(power_of_two_scales=True, columnwise=True),
                                 mxfp8(swizzled=True, columnwise=True), mxfp8(), per_tensor()],
                         ids=["1x128_ue8m0_columnwise", "mxfp8_swizzled_columnwise", "mxfp8",
                              "tensor"])
def test_group_layouts_match_the_reference_quantizer(shape, group, fmt, monkeypatch):
    if shape[-1] % max(fmt.block_size, 1):
        pytest.skip("K is not a multiple of the block")
    x, gate, weight = inputs(shape, torch.float16)
    poisoned(monkeypatch)
    result = gatednorm.rms_norm_gated(x, gate, weight, quantize=fmt, group_size=group,
                                      norm_before_gate=False, rounding="hf")
    monkeypatch.undo()
    y = gatednorm.rms_norm_gated(x, gate, weight, group_size=group, norm_before_gate=False,
                                 rounding="hf")
    assert_matches_reference_of_op_output(result, y)


@pytest.mark.parametrize("tokens", [16, 48, 200], ids=["one-partial-block", "aligned", "partial"])
@pytest.mark.parametrize("fmt", [block_1x128(columnwise=True), mxfp8(columnwise=True)],
                         ids=["1x128", "mxfp8"])
def test_columnwise_copies_of_aligned_and_partial_token_blocks(tokens, fmt, monkeypatch):
    # A token count that is a multiple of 16 lets the transposed copy's stores widen.
    x, gate, weight = inputs((tokens, 256), torch.bfloat16)
    poisoned(monkeypatch)
    result = gatednorm.rms_norm_gated(x, gate, weight, quantize=fmt, group_size=128)
    monkeypatch.undo()
    assert_matches_reference_of_op_output(
        result, gatednorm.rms_norm_gated(x, gate, weight, group_size=128))


def test_the_shapes_take_the_fused_kernel_where_blocks_and_groups_nest():
    assert fused_tiling(128, 2, 128).groups_per_tile == 1
    assert fused_tiling(640, 2, 128).tail_n == 128
    assert fused_tiling(64, 4, 128).groups_per_tile == 2
    assert fused_tiling(96, 4, 32) is not None
    assert fused_tiling(96, 4, 128) is None
    assert fused_tiling(32768, 1, 128) is None


def test_register_cap_applies_to_gdn_tile_of_power_of_two_scales_only():
    gdn = fused_tiling(128, 32, 128)
    assert rowwise_launch(gdn, BLOCK_POWER_OF_TWO) == dict(maxnreg=56)
    assert rowwise_launch(fused_tiling(128, 32, 32), MXFP8_E8M0) == dict(maxnreg=56)
    for kind in (BLOCK_FP32, TENSOR_GIVEN, TENSOR_CURRENT):
        assert rowwise_launch(gdn, kind) == {}
    for other in (fused_tiling(640, 8, 128), fused_tiling(64, 4, 128),
                  dataclasses.replace(gdn, block_rows=2, num_warps=1)):  # decode tile
        assert rowwise_launch(other, BLOCK_POWER_OF_TWO) == {}


@pytest.mark.parametrize("fmt, cap", [("1x128", None), ("1x128_ue8m0", 56), ("mxfp8", 56),
                                      ("1x128_columnwise", None)])
def test_fused_plan_launches_with_the_register_cap_of_its_tile(fmt, cap):
    fmt = as_format(fmt)
    x = torch.zeros(64, 256, dtype=torch.bfloat16)
    tiling = fused_tiling(128, 2, fmt.block_size)
    plan = fused_plan(x, x, None, fmt, tiling, group_size=128, zero_centered_gamma=False,
                      activation="silu", norm_before_gate=True, rounding="te",
                      store_rstd=False, traceable=False)
    if fmt.columnwise:  # the columnwise kernel's own launch
        assert plan.meta["maxnreg"] == columnwise_launch(128, 128, tiling.num_warps)["maxnreg"]
    else:
        assert plan.meta.get("maxnreg") == cap
        assert plan.meta["num_warps"] == tiling.num_warps


def test_mxfp8_scales_are_stored_four_to_a_word_where_tiles_span_whole_128_columns():
    fmt = mxfp8()
    assert fused_scale_words(fmt, fused_tiling(128, 32, 32), 128)
    assert fused_scale_words(fmt, fused_tiling(640, 8, 32), 640)  # head 512 + tail 128
    assert not fused_scale_words(fmt, fused_tiling(64, 4, 32), 64)
    assert not fused_scale_words(fmt, fused_tiling(96, 4, 32), 96)  # head 64 + tail 32
    assert stores_scale_words(fmt, 4096) and not stores_scale_words(fmt, 480)
    assert not stores_scale_words(block_1x128(), 4096)


def test_decode_sizes_take_the_ops_one_warp_tile(decode_tile):
    table = fused_tiling(128, 32, 128)
    decode = few_rows_tiling(table, 128, 1, 32)  # one token of 32 heads: 32 programs
    assert (decode.block_rows, decode.num_warps) == (2, 1)
    assert few_rows_tiling(table, 128, 4096, 32) == table
    # A head + tail tile's order depends on its rows and warps; a two-group tile is wider.
    assert few_rows_tiling(fused_tiling(640, 8, 128), 640, 1, 8) == fused_tiling(640, 8, 128)
    assert few_rows_tiling(fused_tiling(64, 64, 128), 64, 1, 64) == fused_tiling(64, 64, 128)


@pytest.mark.parametrize("tokens", [3, 1100], ids=["decode-tile", "table-tile"])
def test_decode_and_table_tiles_match_the_reference_quantizer(tokens, decode_tile,
                                                             monkeypatch):
    # 1100 tokens of two 128-wide heads: 138 programs of 16 rows, over the decode threshold.
    x, gate, weight = inputs((tokens, 256), torch.bfloat16)
    y = gatednorm.rms_norm_gated(x, gate, weight, group_size=128)
    poisoned(monkeypatch)
    result = gatednorm.rms_norm_gated(x, gate, weight, group_size=128, quantize="1x128")
    assert_matches_reference_of_op_output(result, y)


def special_inputs(dtype):
    """Rows whose y holds an all-zero block, NaN, +-inf, -0.0 and subnormal E4M3 results."""
    x = torch.randn(4, 256, dtype=dtype)
    gate = torch.randn(4, 256, dtype=dtype)
    x[0] = 0  # y = 0 everywhere: amax 0
    gate[1, 3] = float("nan")  # y NaN at one element
    gate[2, 5] = float("inf")  # y +-inf
    gate[2, 130] = -float("inf")  # silu(-inf) = NaN * 0 = NaN (PyTorch's and the kernel's)
    gate[3, :128] = -0.0  # silu(-0) = -0: y = -0 or +0 by x's sign
    x[3, 128] = 300  # one large element: the rest of its block gives subnormal E4M3 results
    return x, gate


# Groups of 96 straddle the 128-element blocks (the unfused path); MXFP8's 32-element blocks
# fit them and take the fused kernel, as the 96-wide case above. Columnwise copies: fused on
# groups of 128, the unfused path's kernel of both copies on groups of 96 (head + tail tiles).
@pytest.mark.parametrize("name, group", [
    (name, 128) for name in ("1x128", "1x128_ue8m0", "mxfp8", "per_tensor", "1x128_columnwise",
                             "mxfp8_columnwise")] + [
    (name, 96) for name in ("1x128", "1x128_ue8m0", "per_tensor", "1x128_columnwise",
                            "mxfp8_columnwise")])
def test_zero_nan_inf_negative_zero_and_subnormal_blocks_match_the_reference(name, group):
    x, gate = special_inputs(torch.float16)
    if group == 96:
        x, gate = x[:, :192].repeat(1, 2), gate[:, :192].repeat(1, 2)  # 4 groups of 96
    result = gatednorm.rms_norm_gated(x, gate, quantize=name, group_size=group)
    y = gatednorm.rms_norm_gated(x, gate, group_size=group)
    assert y.isnan().any() and y.isinf().any() and (y == 0).all(-1).any()
    assert_matches_reference_of_op_output(result, y)
    assert codes(result.data)[3, :128].eq(0x80).any()


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_quantize_rounded_false_quantizes_the_fp32_value(rounding):
    x, gate, weight = inputs((8, 256), torch.bfloat16)
    fmt = block_1x128(quantize_rounded=False)
    result = gatednorm.rms_norm_gated(x, gate, weight, quantize=fmt, group_size=128,
                                      rounding=rounding)
    exact = gatednorm.rms_norm_gated(x.double(), gate.double(), weight.double(),
                                     group_size=128, rounding=rounding)
    rounded = gatednorm.rms_norm_gated(x, gate, weight, quantize="1x128", group_size=128,
                                       rounding=rounding)
    error = (result.dequantize(torch.float64) - exact).abs()
    assert torch.all(error <= exact.abs().unflatten(-1, (2, 128)).amax(-1, keepdim=True)
                     .expand(-1, -1, 128).flatten(-2) * 2.0 ** -3)
    assert not torch.equal(codes(result.data), codes(rounded.data))
    if rounding == "fp32":
        # With every intermediate in fp32, the fp32 value is the float32 op's output.
        y32 = gatednorm.rms_norm_gated(x.float(), gate.float(), weight.float(),
                                       group_size=128, rounding="fp32")
        assert_matches_reference_of_op_output(result, y32)


def test_quantize_rounded_false_on_the_unfused_path_raises():
    x, gate, _ = inputs((4, 384), torch.float16)
    with pytest.raises(ValueError, match="quantize_rounded=False"):
        gatednorm.rms_norm_gated(x, gate, quantize=block_1x128(quantize_rounded=False),
                                 group_size=96)


@pytest.mark.parametrize("name", ["1x128", "1x128_ue8m0", "per_tensor", "1x128_columnwise"])
def test_blocks_whose_amax_over_448_underflows_match_the_reference(name, monkeypatch):
    # fp32 y of a few 2**-149 (a weight of 2**-149): amax / 448 rounds to 0, and the scale
    # is the smallest positive fp32 (rounded up: 2**-126) instead.
    x, gate, _ = inputs((4, 256), torch.float32)
    weight = torch.full((256,), 2.0**-149)
    options = dict(group_size=128, rounding="fp32")
    poisoned(monkeypatch)
    result = gatednorm.rms_norm_gated(x, gate, weight, quantize=name, **options)
    monkeypatch.undo()
    y = gatednorm.rms_norm_gated(x, gate, weight, **options)
    assert 0 < y.abs().max() < 448 * 2.0**-150
    assert_matches_reference_of_op_output(result, y)


def test_strided_inputs_and_the_gdn_head_view():
    # x a permuted [B, S, H * D] view, the gate a slice of a wider projection output.
    x = torch.randn(3, 2, 256, dtype=torch.float16).transpose(0, 1)
    projection = torch.randn(2, 3, 512, dtype=torch.float16)
    gate = projection[..., 128:384]
    result = gatednorm.rms_norm_gated(x, gate, quantize="1x128_column", group_size=64)
    y = gatednorm.rms_norm_gated(x, gate, group_size=64)
    assert result.data.shape == (6, 256) and result.shape == (2, 3, 256)
    assert_matches_reference_of_op_output(result, y)


def test_delayed_scaling_uses_the_given_scale_and_maxes_amax_into_the_buffer(monkeypatch):
    x, gate, weight = inputs((8, 256), torch.float16)
    scale = torch.tensor([0.004])
    amax_out = torch.zeros(1)
    poisoned(monkeypatch)
    result = gatednorm.rms_norm_gated(x, gate, weight, quantize=per_tensor(scale,
                                                                           amax_out=amax_out))
    monkeypatch.undo()
    y = gatednorm.rms_norm_gated(x, gate, weight)
    assert_matches_reference_of_op_output(result, y)  # amax included: the buffer started at 0
    assert result.amax is amax_out
    assert torch.equal(amax_out, y.float().abs().amax().reshape(1))
    assert torch.equal(result.scale, scale)
    assert codes(result.data).eq(0x7E).any()  # saturated at 448
    scale.fill_(1.0)  # the next step's scale: the output keeps the one it was quantized with
    assert torch.equal(result.scale, torch.tensor([0.004]))


@pytest.mark.parametrize("given_scale", [True, False], ids=["delayed", "current"])
@pytest.mark.parametrize("group_size, dtype", [(128, torch.bfloat16), (48, torch.bfloat16),
                                               (128, torch.float64)],
                         ids=["fused", "unfused", "reference-path"])
def test_amax_out_keeps_the_running_maximum_of_the_calls(given_scale, group_size, dtype):
    # Over calls the buffer holds the largest amax (TransformerEngine's delayed-scaling amax,
    # which the recipe resets); each call's data and scale are those of a call without it.
    x, gate, weight = inputs((8, 384), dtype)
    small_weight, large_weight = weight, weight * 4
    scale = torch.tensor([0.02]) if given_scale else None
    amax_out = torch.zeros(1)
    with_buffer = per_tensor(scale, amax_out=amax_out)
    amaxes = []
    for w in (large_weight, small_weight):
        result = gatednorm.rms_norm_gated(x, gate, w, quantize=with_buffer, group_size=group_size)
        plain = gatednorm.rms_norm_gated(x, gate, w, quantize=per_tensor(scale),
                                         group_size=group_size)
        assert torch.equal(codes(result.data), codes(plain.data))
        assert torch.equal(result.scale, plain.scale)
        amaxes.append(plain.amax)
        assert result.amax is amax_out
        assert torch.equal(amax_out, torch.maximum(*amaxes) if len(amaxes) == 2 else amaxes[0])
    assert amaxes[0] > amaxes[1]
    amax_out.zero_()  # the recipe's reset: the next call's amax alone
    gatednorm.rms_norm_gated(x, gate, small_weight, quantize=with_buffer, group_size=group_size)
    assert torch.equal(amax_out, amaxes[1])


def test_module_with_quantize_returns_the_quantized_output():
    module = gatednorm.RMSNormGated(256, group_size=128, quantize="mxfp8").half()
    x, gate, _ = inputs((4, 256), torch.float16)
    result = module(x, gate)
    assert isinstance(result, gatednorm.quantize.QuantizedOutput)
    plain = gatednorm.RMSNormGated(256, group_size=128).half()
    assert_matches_reference_of_op_output(result, plain(x, gate))


def test_empty_input_returns_empty_outputs(monkeypatch):
    x = torch.empty(0, 256, dtype=torch.float16)
    poisoned(monkeypatch)
    result = gatednorm.rms_norm_gated(x, x, quantize="mxfp8_swizzled")
    assert result.data.shape == (0, 256) and result.scale.numel() == 0
    # Per-tensor scales of no tokens: the given scale, or current scaling's of amax 0.
    delayed = gatednorm.rms_norm_gated(x, x, quantize=per_tensor(torch.tensor([0.5])))
    current = gatednorm.rms_norm_gated(x, x, quantize="per_tensor")
    assert delayed.scale.tolist() == [0.5] and current.scale.tolist() == [1.0]
    assert delayed.amax.tolist() == [0.0] and current.amax.tolist() == [0.0]


@pytest.mark.parametrize("x_dtype, weight_dtype, zero_centered", [
    (torch.float32, torch.float32, False),
    (torch.bfloat16, torch.float32, True),
    (torch.float16, None, False),
])
def test_fp32_inputs_fp32_weights_zero_centered_and_no_weight(x_dtype, weight_dtype,
                                                              zero_centered):
    x, gate, weight = inputs((8, 256), x_dtype, weight_dtype)
    weight = None if weight_dtype is None else weight
    options = dict(group_size=128, rounding="hf", zero_centered_gamma=zero_centered)
    result = gatednorm.rms_norm_gated(x, gate, weight, quantize="1x128", **options)
    assert_matches_reference_of_op_output(result, gatednorm.rms_norm_gated(x, gate, weight,
                                                                           **options))


@pytest.mark.parametrize("name", ["1x128", "1x128_ue8m0", "1x128_ue8m0_column", "mxfp8",
                                  "mxfp8_swizzled", "1x128_columnwise", "mxfp8_columnwise"])
def test_scale_rule_edges_match_the_reference(name, monkeypatch):
    # Swizzled scales of a float32 x need whole 128-row tiles.
    rows = 128 if name == "mxfp8_swizzled" else 3
    x, gate, weight, options = blocks_with_maxima(scale_rule_edges(), rows)
    poisoned(monkeypatch)
    result = gatednorm.rms_norm_gated(x, gate, weight, quantize=name, **options)
    monkeypatch.undo()
    y = gatednorm.rms_norm_gated(x, gate, weight, **options)
    assert torch.equal(y[0], weight)  # the blocks hold the maxima the test means
    assert_matches_reference_of_op_output(result, y)
