"""Training through the quantized output: gradients through the anchor equal the unquantized
op's bit for bit; torch.compile traces the whole thing without recompiling across row counts."""

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import gatednorm
from gatednorm import ops
from gatednorm.quantize import per_tensor

OPTIONS = [
    dict(group_size=128, norm_before_gate=True, rounding="te", activation="silu"),
    dict(group_size=64, norm_before_gate=True, rounding="hf", activation="sigmoid"),
    dict(group_size=640, norm_before_gate=False, rounding="fp32", activation="silu"),
    dict(group_size=96, norm_before_gate=False, rounding="te", activation="silu"),
]


def leaves(shape, dtype):
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    gate = torch.randn(shape, dtype=dtype, requires_grad=True)
    weight = (1 + 0.5 * torch.randn(shape[-1], dtype=dtype)).requires_grad_()
    return x, gate, weight


def grads_of(y, dy, tensors):
    return torch.autograd.grad(y, tensors, dy)


@pytest.mark.skipif(not ops.INTERPRET, reason="CPU kernel tests need TRITON_INTERPRET=1")
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: f"g{o['group_size']}-{o['rounding']}")
@pytest.mark.parametrize("name", ["1x128", "mxfp8", "per_tensor"])
def test_gradients_through_the_anchor_equal_the_unquantized_ops(options, name):
    dtype = torch.float16 if options["group_size"] != 64 else torch.bfloat16
    k = 1280 if options["group_size"] == 640 else 384 if options["group_size"] == 96 else 256
    x, gate, weight = leaves((6, k), dtype)
    result = gatednorm.rms_norm_gated(x, gate, weight, quantize=name, **options)
    assert result.anchor.untyped_storage().nbytes() == result.anchor.element_size()
    assert result.anchor.shape == x.shape and result.anchor.dtype == dtype
    dy = torch.randn(x.shape, dtype=dtype)
    quantized_grads = grads_of(result.dequantize(), dy, (x, gate, weight))
    y = gatednorm.rms_norm_gated(x, gate, weight, **options)
    for quantized, plain in zip(quantized_grads, grads_of(y, dy, (x, gate, weight))):
        assert quantized.dtype == plain.dtype
        assert torch.equal(quantized, plain)


def test_a_consumer_takes_the_anchor_and_returns_its_input_gradient():
    """The pattern an FP8 linear follows: forward from data and scales, backward to the anchor."""

    class DequantizedLinear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, anchor, data, scale, fmt, weight):
            ctx.save_for_backward(weight)
            values = gatednorm.quantize.dequantize(data, scale, fmt, torch.float32)
            return values @ weight.t()

        @staticmethod
        def backward(ctx, grad_out):
            (weight,) = ctx.saved_tensors
            return (grad_out @ weight).to(torch.float64), None, None, None, None

    x, gate, weight = leaves((4, 256), torch.float64)
    result = gatednorm.rms_norm_gated(x, gate, weight, quantize="1x128")
    projection = torch.randn(8, 256)
    out = DequantizedLinear.apply(result.anchor, result.data, result.scale, result.format,
                                  projection)
    grad_out = torch.randn(4, 8)
    quantized_grads = grads_of(out, grad_out, (x, gate, weight))
    y = gatednorm.rms_norm_gated(x, gate, weight)
    plain_grads = grads_of(y, (grad_out @ projection).double(), (x, gate, weight))
    for quantized, plain in zip(quantized_grads, plain_grads):
        assert torch.equal(quantized, plain)


def test_no_gradient_needed_gives_no_anchor():
    x = torch.randn(4, 256, dtype=torch.float16)
    result = gatednorm.rms_norm_gated(x, x, quantize="1x128")
    assert result.anchor is None
    assert result.dequantize().shape == x.shape


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64],
                         ids=["kernels", "reference-path"])
def test_compile_fullgraph_traces_forward_and_backward_without_recompiling(dtype):
    if dtype == torch.float16 and not ops.INTERPRET:
        pytest.skip("CPU kernels need TRITON_INTERPRET=1")

    def step(x, gate, weight):
        result = gatednorm.rms_norm_gated(x, gate, weight, quantize="1x128", group_size=128)
        return result.data, result.scale, result.dequantize().float().square().sum()

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(step, fullgraph=True, dynamic=True, backend=counter)
    frames_after_first_call = None
    for rows in (3, 5, 9):
        x, gate, weight = leaves((rows, 256), dtype)
        data, scale, loss = compiled(x, gate, weight)
        loss.backward()
        expected = gatednorm.rms_norm_gated(x, gate, weight, quantize="1x128", group_size=128)
        assert torch.equal(data.view(torch.uint8), expected.data.view(torch.uint8))
        assert torch.equal(scale, expected.scale)
        plain = [t.grad for t in (x, gate, weight)]
        for t in (x, gate, weight):
            t.grad = None
        expected.dequantize().float().square().sum().backward()
        for got, want in zip(plain, (x.grad, gate.grad, weight.grad)):
            assert torch.equal(got, want)
        frames_after_first_call = frames_after_first_call or counter.frame_count
    assert counter.frame_count == frames_after_first_call


@pytest.mark.skipif(not ops.INTERPRET, reason="CPU kernel tests need TRITON_INTERPRET=1")
def test_compile_fullgraph_maxes_amax_into_the_callers_buffer():
    amax_out = torch.zeros(1)
    fmt = per_tensor(torch.tensor([0.01]), amax_out=amax_out)

    def step(x, gate, weight):
        result = gatednorm.rms_norm_gated(x, gate, weight, quantize=fmt, group_size=128)
        return result.data, result.amax

    compiled = torch.compile(step, fullgraph=True, dynamic=True, backend="aot_eager")
    running = torch.zeros(1)
    for rows, weight_scale in ((3, 4.0), (5, 1.0)):
        x, gate, weight = leaves((rows, 256), torch.float16)
        weight = weight.detach() * weight_scale
        data, amax = compiled(x, gate, weight)
        expected = gatednorm.rms_norm_gated(x, gate, weight, quantize=per_tensor(fmt.scale),
                                            group_size=128)
        running = torch.maximum(running, expected.amax)
        assert torch.equal(data.view(torch.uint8), expected.data.view(torch.uint8))
        assert torch.equal(amax_out, running) and torch.equal(amax, running)


@pytest.mark.skipif(not ops.INTERPRET, reason="CPU kernel tests need TRITON_INTERPRET=1")
def test_fp8_linear_backward_reaches_the_norm_and_the_weight():
    from gatednorm.quantize.linear import (
        dequantize_weight_128x128,
        fp8_linear,
        quantize_weight_128x128,
    )

    x, gate, weight = leaves((4, 256), torch.bfloat16)
    projection = torch.randn(128, 256, dtype=torch.bfloat16, requires_grad=True)
    result = gatednorm.rms_norm_gated(x, gate, weight, quantize="1x128_column",
                                      group_size=128)
    out = fp8_linear(result, projection)
    data, scale = quantize_weight_128x128(projection.detach())
    expected = (result.dequantize(torch.float32) @ dequantize_weight_128x128(data, scale).t())
    assert torch.equal(out, expected.to(torch.bfloat16))
    grad_out = torch.randn_like(out)
    grads = grads_of(out, grad_out, (x, gate, weight, projection))
    y = gatednorm.rms_norm_gated(x, gate, weight, group_size=128)
    plain = grads_of(y, (grad_out @ projection.detach()), (x, gate, weight))
    for got, want in zip(grads[:3], plain):
        assert torch.equal(got, want)
    assert torch.equal(grads[3], grad_out.t() @ result.dequantize())
