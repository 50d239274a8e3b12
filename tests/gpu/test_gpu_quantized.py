"""FP8 output on the GPU: bit-exact against the reference quantizer of the op's y on model
shapes, the scaled_mm consumers, training a tiny GDN output block next to its bf16 twin, CUDA
graphs and torch.compile."""

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import gatednorm
from gatednorm.quantize import (
    FORMAT_NAMES,
    as_format,
    block_1x128,
    dequantize,
    per_tensor,
    quantize_1x128,
    reference_quantize,
)
from gatednorm.quantize.launch import fused_tiling
from gatednorm.quantize.linear import (
    blockwise_scaled_mm,
    blockwise_scaled_mm_available,
    dequantize_weight_128x128,
    quantize_weight_128x128,
)
from gatednorm.quantize.reference import fp32_scale, mismatches

from .helpers import requires_cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quantized_cases import blocks_with_maxima, scale_rule_edges  # noqa: E402

pytestmark = [requires_cuda, pytest.mark.timeout(300)]

# (name, tokens, K, group, activation, norm_before_gate): the benchmark's model shapes, the
# token counts cut to keep the suite fast.
MODEL_SHAPES = [
    ("gdn-d128", 4096, 32 * 128, 128, "silu", True),
    ("gdn-d64", 4096, 32 * 64, 64, "silu", True),
    ("kimi", 2048, 96 * 128, 128, "sigmoid", True),
    ("mamba2", 2048, 5120, 640, "silu", False),
    ("nemotron-h", 1024, 8192, 1024, "silu", False),
    ("d96-unfused", 1000, 32 * 96, 96, "silu", True),
    ("decode", 7, 32 * 128, 128, "silu", True),
]


def codes(t):
    return t.view(torch.uint8)


def model_inputs(tokens, k, dtype=torch.bfloat16):
    x = torch.randn(tokens, k, device="cuda", dtype=dtype)
    gate = torch.randn(tokens, k, device="cuda", dtype=dtype) * 2
    weight = 1 + 0.2 * torch.randn(k, device="cuda", dtype=dtype)
    return x, gate, weight


def assert_bit_exact(result, y):
    assert mismatches(result, y) == []


def check_case(name, shape, dtype, rounding):
    _, tokens, k, group, activation, norm_before_gate = shape
    if name == "delayed":
        fmt = per_tensor(torch.tensor([0.01], device="cuda"))
    elif name == "fp32-value":
        if fused_tiling(group, k // group, 128) is None:
            pytest.skip("the fp32 option needs the fused kernel")
        fmt = block_1x128(quantize_rounded=False)
    else:
        fmt = as_format(name)
    if fmt.block_size and k % fmt.block_size:
        pytest.skip("K is not a multiple of the block")
    x, gate, weight = model_inputs(tokens, k, dtype)
    options = dict(group_size=group, activation=activation, norm_before_gate=norm_before_gate,
                   rounding=rounding)
    result = gatednorm.rms_norm_gated(x, gate, weight, quantize=fmt, **options)
    if fmt.quantize_rounded:
        y = gatednorm.rms_norm_gated(x, gate, weight, **options)
        assert_bit_exact(result, y)
    else:
        # The fp32 value is within half an fp8 step of the fp64 output.
        exact = gatednorm.rms_norm_gated(x.double(), gate.double(), weight.double(), **options)
        block_max = exact.abs().unflatten(-1, (-1, 128)).amax(-1, keepdim=True)
        error = (result.dequantize(torch.float64) - exact).abs().unflatten(-1, (-1, 128))
        assert torch.all(error <= block_max * 2.0 ** -3)


@pytest.mark.parametrize("name", sorted(FORMAT_NAMES) + ["delayed", "fp32-value"])
@pytest.mark.parametrize("shape", MODEL_SHAPES, ids=[s[0] for s in MODEL_SHAPES])
def test_every_format_on_model_shapes_is_the_reference_quantization_of_the_ops_output(
        name, shape):
    check_case(name, shape, torch.bfloat16, "te")


@pytest.mark.parametrize("name", ["1x128", "mxfp8", "per_tensor", "fp32-value"])
@pytest.mark.parametrize("shape", [MODEL_SHAPES[1], MODEL_SHAPES[3]], ids=["gdn-d64", "mamba2"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("rounding", ["te", "fp32", "hf"])
def test_every_rounding_and_dtype_is_the_reference_quantization_of_the_ops_output(
        name, shape, dtype, rounding):
    check_case(name, shape, dtype, rounding)


@pytest.mark.parametrize("name", sorted(FORMAT_NAMES))
@pytest.mark.parametrize("tokens", [1, 7, 33])
def test_decode_sizes_on_the_one_warp_tile_are_the_reference_quantization(name, tokens,
                                                                         decode_tile):
    check_case(name, ("decode", tokens, 32 * 128, 128, "silu", True), torch.bfloat16, "te")


@pytest.mark.parametrize("name", ["1x128", "1x128_ue8m0", "per_tensor", "1x128_columnwise",
                                  "mxfp8"])
def test_blocks_whose_amax_over_448_underflows_are_the_reference_quantization(name):
    # fp32 y of a few 2**-149: amax / 448 rounds to 0; fp32 scales take 2**-149 (2**-126
    # rounded up to a power of two), which the kernels divide by (or multiply by the inverse
    # of) without flushing the subnormal operands.
    x, gate, _ = model_inputs(256, 4096, torch.float32)
    weight = torch.full((4096,), 2.0**-149, device="cuda")
    options = dict(group_size=128, rounding="fp32")
    result = gatednorm.rms_norm_gated(x, gate, weight, quantize=name, **options)
    y = gatednorm.rms_norm_gated(x, gate, weight, **options)
    assert 0 < y.abs().max() < 448 * 2.0**-150
    assert_bit_exact(result, y)


@pytest.mark.parametrize("name", ["1x128", "1x128_ue8m0", "mxfp8", "mxfp8_swizzled",
                                  "1x128_columnwise", "mxfp8_columnwise"])
def test_scale_rule_edges_are_the_reference_quantization(name):
    # Power-of-two scales take their exponent from amax's bits, not from amax / 448: maxima
    # at 448 * 2**e and one ulp either side, subnormal quotients, infinity and zero.
    x, gate, weight, options = blocks_with_maxima(scale_rule_edges(), 256, device="cuda")
    result = gatednorm.rms_norm_gated(x, gate, weight, quantize=name, **options)
    y = gatednorm.rms_norm_gated(x, gate, weight, **options)
    assert torch.equal(y[0], weight)
    assert_bit_exact(result, y)


def test_reference_scales_are_correctly_rounded_on_the_gpu():
    # The spec divides: amax / 448 rounded once, as on the CPU (where PyTorch divides too) and in
    # the kernels. PyTorch's CUDA division by a Python number multiplies by the reciprocal.
    amax = torch.rand(1 << 20, device="cuda") * 1000
    exact = (amax.cpu().double() / 448).float()  # one rounding of the exact quotient
    assert torch.equal(fp32_scale(amax).cpu(), exact)


@pytest.mark.parametrize("name", ["1x128", "1x128_ue8m0", "mxfp8", "per_tensor"])
@pytest.mark.parametrize("group", [128, 96])
def test_zero_nan_inf_and_negative_zero_blocks_are_the_reference_quantization(name, group):
    x, gate, _ = model_inputs(64, 768)
    x[0] = 0
    gate[1, 3] = float("nan")
    gate[2, 5] = float("inf")
    gate[3, :128] = -0.0
    x[4, 128] = 3000
    result = gatednorm.rms_norm_gated(x, gate, quantize=name, group_size=group)
    y = gatednorm.rms_norm_gated(x, gate, group_size=group)
    assert y.isnan().any() and y.isinf().any()
    assert_bit_exact(result, y)


@pytest.mark.parametrize("shape", MODEL_SHAPES[:4], ids=[s[0] for s in MODEL_SHAPES[:4]])
def test_gradients_through_the_anchor_equal_the_unquantized_ops(shape):
    _, tokens, k, group, activation, norm_before_gate = shape
    leaves = [t.requires_grad_() for t in model_inputs(tokens, k)]
    options = dict(group_size=group, activation=activation, norm_before_gate=norm_before_gate)
    result = gatednorm.rms_norm_gated(*leaves, quantize="1x128", **options)
    dy = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
    quantized = torch.autograd.grad(result.dequantize(), leaves, dy)
    plain = torch.autograd.grad(gatednorm.rms_norm_gated(*leaves, **options), leaves, dy)
    for got, want in zip(quantized, plain):
        assert torch.equal(got, want)


def reference_gemm(a, b):
    return (a.float() @ b.float().t()).to(torch.bfloat16)


def assert_gemm_close(out, expected, a, b):
    """Same products, another accumulation and one bf16 rounding of the result. Hopper's FP8
    tensor cores accumulate with fewer bits than fp32 (about 14), so where the sum cancels
    the error scales with sum |a_k b_k|, not with the result: 2^-12 of it (on an H100, 256 x
    4096 x 512: at most 0.09 where sum |a_k b_k| is about 1.6e3)."""
    magnitude = a.abs().float() @ b.abs().float().t()
    error = (out.float() - expected.float()).abs()
    limit = 2e-2 * expected.float().abs() + 2.0 ** -12 * magnitude + 2e-2
    assert torch.all(error <= limit), (error - limit).max()


def test_per_tensor_output_feeds_scaled_mm():
    x, gate, weight = model_inputs(256, 4096)
    result = gatednorm.rms_norm_gated(x, gate, weight, quantize="per_tensor", group_size=128)
    w = torch.randn(512, 4096, device="cuda", dtype=torch.bfloat16)
    w_data, w_scale, _ = reference_quantize(w, "per_tensor")
    out = torch._scaled_mm(result.data, w_data.t(), result.scale.reshape(()),
                           w_scale.reshape(()), out_dtype=torch.bfloat16)
    a = result.dequantize(torch.float32)
    b = dequantize(w_data, w_scale, as_format("per_tensor"))
    assert_gemm_close(out, reference_gemm(a, b), a, b)


def test_one_block_rows_feed_rowwise_scaled_mm():
    # K = 128: one 1x128 block a row is a per-token (rowwise) scale.
    x, gate, weight = model_inputs(256, 128)
    result = gatednorm.rms_norm_gated(x, gate, weight, quantize="1x128")
    w = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16)
    w_data, w_scale = quantize_1x128(w)
    out = torch._scaled_mm(result.data, w_data.t(), result.scale, w_scale.t(),
                           out_dtype=torch.bfloat16)
    a, b = result.dequantize(torch.float32), dequantize(w_data, w_scale, as_format("1x128"))
    assert_gemm_close(out, reference_gemm(a, b), a, b)


def test_1x128_output_feeds_blockwise_scaled_mm():
    if not blockwise_scaled_mm_available(torch.device("cuda")):
        pytest.skip(f"torch {torch.__version__} has no 1x128 x 128x128 blockwise scaled_mm "
                    "on this GPU (needs torch.nn.functional.scaled_mm and sm90)")
    x, gate, weight = model_inputs(512, 4096)
    result = gatednorm.rms_norm_gated(x, gate, weight, quantize="1x128_column",
                                      group_size=128)
    assert result.scale.stride() == (1, 512)
    w = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16)
    w_data, w_scale = quantize_weight_128x128(w)
    out = blockwise_scaled_mm(result.data, result.scale, w_data, w_scale, torch.bfloat16)
    a, b = result.dequantize(torch.float32), dequantize_weight_128x128(w_data, w_scale)
    assert_gemm_close(out, reference_gemm(a, b), a, b)


def load_example():
    """examples/quantized_gdn_block.py as a module (examples/ is not a package)."""
    path = Path(__file__).resolve().parents[2] / "examples" / "quantized_gdn_block.py"
    spec = importlib.util.spec_from_file_location("quantized_gdn_block", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_gdn_output_block_trains_like_bf16():
    example = load_example()
    args = argparse.Namespace(steps=300, tokens=512, heads=4, head_dim=128, hidden=256,
                              lr=1e-3)
    device = torch.device("cuda")
    bf16 = torch.tensor(example.train(False, args, device, torch.bfloat16))
    fp8 = torch.tensor(example.train(True, args, device, torch.bfloat16))
    assert bf16[-50:].mean() < 0.5 * bf16[:10].mean()  # it learns
    # FP8 forward noise: the curves agree to a few percent over the last 50 steps.
    assert abs(fp8[-50:].mean() - bf16[-50:].mean()) <= 0.05 * bf16[-50:].mean()


@pytest.mark.parametrize("name", ["1x128", "mxfp8_swizzled", "per_tensor"])
def test_cuda_graph_replay_matches_eager(name):
    x, gate, weight = model_inputs(32, 4096)
    eager = gatednorm.rms_norm_gated(x, gate, weight, quantize=name, group_size=128)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        gatednorm.rms_norm_gated(x, gate, weight, quantize=name, group_size=128)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = gatednorm.rms_norm_gated(x, gate, weight, quantize=name, group_size=128)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    expected = gatednorm.rms_norm_gated(x, gate, weight, quantize=name, group_size=128)
    assert torch.equal(codes(captured.data), codes(expected.data))
    assert torch.equal(captured.scale.view(torch.uint8), expected.scale.view(torch.uint8))
    assert not torch.equal(codes(captured.data), codes(eager.data))


def test_delayed_scaling_amax_buffer_under_compile_and_cuda_graphs():
    # The kernel maxes the call's amax into the caller's buffer (a mutated op argument under
    # torch.compile; a captured kernel argument in a CUDA graph).
    x, gate, weight = model_inputs(64, 4096)
    amax_out = torch.zeros(1, device="cuda")
    fmt = per_tensor(torch.tensor([0.01], device="cuda"), amax_out=amax_out)
    plain = per_tensor(fmt.scale)

    def step(x, gate, weight):
        return gatednorm.rms_norm_gated(x, gate, weight, quantize=fmt, group_size=128).data

    torch._dynamo.reset()
    data = torch.compile(step, fullgraph=True)(x, gate, weight)
    expected = gatednorm.rms_norm_gated(x, gate, weight, quantize=plain, group_size=128)
    assert torch.equal(codes(data), codes(expected.data))
    assert torch.equal(amax_out, expected.amax)

    amax_out.zero_()
    step(x, gate, weight)  # compiles the eager launch's kernels before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(x, gate, weight)
    amax_out.zero_()
    weight.mul_(3)
    graph.replay()
    torch.cuda.synchronize()
    expected = gatednorm.rms_norm_gated(x, gate, weight, quantize=plain, group_size=128)
    assert torch.equal(codes(captured), codes(expected.data))
    assert torch.equal(amax_out, expected.amax)


# 1x128_columnwise: the fused columnwise kernel, launched with a register cap. Its token
# counts span several 128-token blocks: a graph compiled for one block (the columnwise
# scales' [K, 1]) specializes that 1 and recompiles once for more (docs/quantized.md).
@pytest.mark.parametrize("name, token_counts", [("1x128_ue8m0", (64, 100, 333)),
                                               ("1x128_columnwise", (200, 333, 1000))])
def test_compile_fullgraph_matches_eager_without_recompiling(name, token_counts):
    torch._dynamo.reset()
    counts = []

    def step(x, gate, weight):
        result = gatednorm.rms_norm_gated(x, gate, weight, quantize=name, group_size=128)
        columnwise = result.columnwise_data if result.format.columnwise else result.data
        return (result.data, result.scale, columnwise,
                result.dequantize().float().square().sum())

    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    for tokens in token_counts:
        leaves = [t.requires_grad_() for t in model_inputs(tokens, 4096)]
        data, scale, columnwise, loss = compiled(*leaves)
        loss.backward()
        compiled_grads = [t.grad.clone() for t in leaves]
        for t in leaves:
            t.grad = None
        expected = gatednorm.rms_norm_gated(*leaves, quantize=name, group_size=128)
        expected.dequantize().float().square().sum().backward()
        assert torch.equal(codes(data), codes(expected.data))
        assert torch.equal(scale, expected.scale)
        if expected.format.columnwise:
            assert torch.equal(codes(columnwise), codes(expected.columnwise_data))
        for got, t in zip(compiled_grads, leaves):
            assert torch.equal(got, t.grad)
        counts.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    assert counts[0] == counts[-1]
