"""y, dx, dgate and dweight of the fused kernels against fp64 and the same-dtype composite.

Every option combination runs the Triton kernels (through the interpreter) forward and
backward with NaN-poisoned output allocations, then checks:
- against fp64 (the composite on float64 copies): error at most twice the error of the
  same-convention eager composite in the working dtype, plus a small slack;
- against that composite itself: the same bits on almost every 16-bit element.
"""

import itertools
import math

import pytest
import torch

import gatednorm
from gatednorm.kernels import config, launch

from conftest import (
    ACTIVATIONS,
    ROUNDINGS,
    assert_finite,
    assert_matches_composite,
    assert_three_way,
    composite,
    dtype_id,
    fp64_truth,
    fused,
    make_inputs,
    nan_poisoned_empty,
    rows_of,
    working_dtype_rounding,
)

pytestmark = pytest.mark.usefixtures("interpreter")

# 50 rows: not a multiple of any tile height, so the masked last tile is exercised.
SHAPE = (2, 25, 128)
GROUP_SIZES = (None, 32)
WEIGHT_KINDS = ("no_weight", "weight", "zero_centered")


def _option_cases():
    for activation, norm_before_gate, group_size, weight_kind, rounding in itertools.product(
            ACTIVATIONS, (True, False), GROUP_SIZES, WEIGHT_KINDS, ROUNDINGS):
        options = dict(activation=activation, norm_before_gate=norm_before_gate,
                       group_size=group_size, rounding=rounding,
                       zero_centered_gamma=weight_kind == "zero_centered")
        case_id = "-".join([activation, "norm_first" if norm_before_gate else "gate_first",
                            f"group{group_size}" if group_size else "whole_row", weight_kind,
                            rounding])
        yield pytest.param(options, weight_kind != "no_weight", id=case_id)


OPTION_CASES = list(_option_cases())
DTYPES = [pytest.param(d, id=dtype_id(d)) for d in (torch.bfloat16, torch.float16, torch.float32)]

_results: dict = {}


def _run_all(dtype, options, has_weight, shape=SHAPE, **input_kwargs):
    """(kernel, composite, fp64) results; cached so both comparisons of a case share one run."""
    key = (dtype, tuple(sorted(options.items())), has_weight, shape,
           tuple(sorted(input_kwargs.items())))
    if key not in _results:
        torch.manual_seed(0)
        x, gate, weight, dy = make_inputs(
            shape, dtype, has_weight=has_weight,
            zero_centered_gamma=options.get("zero_centered_gamma", False), **input_kwargs)
        _results[key] = (fused(x, gate, weight, dy, **options),
                         composite(x, gate, weight, dy, **options),
                         fp64_truth(x, gate, weight, dy, **options))
    return _results[key]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("options, has_weight", OPTION_CASES)
def test_error_vs_fp64_at_most_twice_the_composite_error(dtype, options, has_weight):
    kernel, eager, truth = _run_all(dtype, options, has_weight)
    assert_finite(kernel)
    assert_three_way(kernel, eager, truth, rows_of(SHAPE))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("options, has_weight", OPTION_CASES)
def test_agrees_with_same_dtype_composite(dtype, options, has_weight):
    kernel, eager, _ = _run_all(dtype, options, has_weight)
    assert_matches_composite(kernel, eager, dtype)


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_zero_centered_gamma_without_weight_raises(rounding):
    x, gate, _, _ = make_inputs((4, 16), torch.bfloat16, has_weight=False)
    with pytest.raises(ValueError, match="zero_centered_gamma"):
        gatednorm.rms_norm_gated(x, gate, None, zero_centered_gamma=True, rounding=rounding)


MIXED_CASES = [
    pytest.param(torch.bfloat16, torch.float32, torch.bfloat16, id="bf16_x-fp32_gate"),
    pytest.param(torch.bfloat16, torch.bfloat16, torch.float32, id="bf16_x-fp32_weight"),
    pytest.param(torch.bfloat16, torch.float32, torch.float32, id="bf16_x-fp32_gate-fp32_weight"),
    pytest.param(torch.float16, torch.float32, torch.float32, id="fp16_x-fp32_gate-fp32_weight"),
    pytest.param(torch.bfloat16, torch.float16, torch.float16, id="bf16_x-fp16_gate-fp16_weight"),
    pytest.param(torch.float32, torch.bfloat16, torch.bfloat16, id="fp32_x-bf16_gate-bf16_weight"),
]


@pytest.mark.parametrize("dtype, gate_dtype, weight_dtype", MIXED_CASES)
@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("norm_before_gate", [True, False], ids=["norm_first", "gate_first"])
@pytest.mark.parametrize("zero_centered_gamma", [False, True], ids=["weight", "zero_centered"])
def test_mixed_precision_gate_and_weight(dtype, gate_dtype, weight_dtype, rounding,
                                         norm_before_gate, zero_centered_gamma):
    options = dict(rounding=rounding, norm_before_gate=norm_before_gate,
                   zero_centered_gamma=zero_centered_gamma, activation="silu")
    kernel, eager, truth = _run_all(dtype, options, True, gate_dtype=gate_dtype,
                                    weight_dtype=weight_dtype)
    # Gradients come back in their input's dtype.
    assert kernel.dgate.dtype == gate_dtype and kernel.dweight.dtype == weight_dtype
    assert_finite(kernel)
    assert_three_way(kernel, eager, truth, rows_of(SHAPE))
    assert_matches_composite(kernel, eager, dtype)


@pytest.mark.parametrize("eps", [0.0, 1e-6, 1e-2, 1.0], ids=lambda e: f"eps{e:g}")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_before_gate", [True, False], ids=["norm_first", "gate_first"])
def test_eps_variety(eps, dtype, norm_before_gate):
    # eps = 0 is well defined on random rows (no row has a zero mean square).
    options = dict(eps=eps, norm_before_gate=norm_before_gate, rounding="te")
    kernel, eager, truth = _run_all(dtype, options, True, shape=(33, 96), scale=0.3)
    assert_finite(kernel)
    assert_three_way(kernel, eager, truth, 33)
    assert_matches_composite(kernel, eager, dtype)


def _assert_fp16_accurate(x, gate, weight, dy, **options):
    """fp16 inputs: finite, within the three-way rule of fp64, and the composite's bits."""
    kernel = fused(x, gate, weight, dy, **options)
    eager = composite(x, gate, weight, dy, **options)
    truth = fp64_truth(x, gate, weight, dy, **options)
    assert_finite(kernel)
    assert_three_way(kernel, eager, truth, rows_of(x.shape))
    assert_matches_composite(kernel, eager, torch.float16)


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("norm_before_gate", [True, False], ids=["norm_first", "gate_first"])
def test_fp16_inputs_whose_squares_overflow_fp16(rounding, norm_before_gate):
    # |x| ~ 300-1000: x^2 is far above fp16's 65504; the statistics must be taken in fp32.
    torch.manual_seed(0)
    shape = (40, 64)
    magnitude = 300 + 700 * torch.rand(shape)
    sign = torch.where(torch.rand(shape) < 0.5, -1.0, 1.0)
    x = (magnitude * sign).half()
    gate = (torch.randn(shape) * 2).half()
    weight = (1 + 0.2 * torch.randn(64)).half()
    dy = torch.randn(shape).half()
    assert torch.isinf(x.float().pow(2).half()).any()
    options = dict(rounding=rounding, norm_before_gate=norm_before_gate)
    _assert_fp16_accurate(x, gate, weight, dy, **options)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("norm_before_gate", [True, False], ids=["norm_first", "gate_first"])
def test_saturated_gates(activation, rounding, norm_before_gate):
    # |gate| up to 100: exp(-gate) overflows fp32 below -88.7 and 1 + exp(-gate) passes 2**126
    # below -87.3; the activation saturates to 0 (or gate) and nothing may become NaN.
    shape = (24, 64)
    special = torch.tensor([-100.0, -88.5, -87.6, -87.4, -87.0, -60.0, -20.0, 0.0, 20.0, 88.5])
    gate = torch.cat([special, torch.linspace(-100, 100, 24 * 64 - special.numel())])
    x, _, weight, dy = make_inputs(shape, torch.float16)
    gate = gate.reshape(shape).half()
    options = dict(activation=activation, rounding=rounding, norm_before_gate=norm_before_gate)
    _assert_fp16_accurate(x, gate, weight, dy, **options)


def _dy_layouts(shape, dtype):
    rows, d = shape
    return {
        "expanded_scalar": torch.ones((), dtype=dtype).expand(shape),
        "expanded_row": torch.randn(d).to(dtype).expand(shape),
        "transposed": torch.randn(d, rows).to(dtype).t(),
        "every_other_column": torch.randn(rows, 2 * d).to(dtype)[:, ::2],
        "every_other_row": torch.randn(2 * rows, d).to(dtype)[::2],
    }


@pytest.mark.parametrize("layout", ["expanded_scalar", "expanded_row", "transposed",
                                    "every_other_column", "every_other_row"])
@pytest.mark.parametrize("norm_before_gate", [True, False], ids=["norm_first", "gate_first"])
def test_dy_with_arbitrary_strides(layout, norm_before_gate):
    shape = (24, 80)
    x, gate, weight, _ = make_inputs(shape, torch.float16)
    dy = _dy_layouts(shape, torch.float16)[layout]
    options = dict(norm_before_gate=norm_before_gate, rounding="te")
    strided = fused(x, gate, weight, dy, **options)
    contiguous = fused(x, gate, weight, dy.contiguous(), **options)
    for (name, a), (_, b) in zip(strided.named(), contiguous.named()):
        assert torch.equal(a, b), f"{name} depends on dy's strides ({layout})"
    assert_three_way(strided, composite(x, gate, weight, dy, **options),
                     fp64_truth(x, gate, weight, dy, **options), shape[0])


def test_sum_backward_gives_stride_zero_dy():
    x, gate, weight, _ = make_inputs((16, 64), torch.float16)
    leaves = [t.clone().requires_grad_() for t in (x, gate, weight)]
    gatednorm.rms_norm_gated(*leaves).sum().backward()
    expected = fused(x, gate, weight, torch.ones(16, 64, dtype=torch.float16))
    for leaf, want in zip(leaves, (expected.dx, expected.dgate, expected.dweight)):
        assert torch.equal(leaf.grad, want)


# 2100 rows of 64: the backward sums them in more chunks than one first-level reduction program
# adds up, so both levels of the fp32 partials' reduction do work (checked in the test).
MANY_ROWS = (2100, 64)


@pytest.mark.parametrize("dtype, shape", [
    pytest.param(torch.bfloat16, (64, 128), id="tile"),
    pytest.param(torch.float32, MANY_ROWS, id="tile-two_level_dweight_reduction"),
    pytest.param(torch.bfloat16, (2, 20000), id="long_row", marks=pytest.mark.slow)])
def test_same_call_twice_gives_identical_bits(dtype, shape):
    if shape == MANY_ROWS:
        block_rows = config.backward_config(shape[-1]).block_rows
        _, num_chunks = config.backward_chunking(shape[0], 1, block_rows)
        assert num_chunks > launch.DWEIGHT_BLOCK_CHUNKS
    first, _, _ = _run_all(dtype, {}, True, shape=shape)
    torch.manual_seed(0)
    x, gate, weight, dy = make_inputs(shape, dtype)
    second = fused(x, gate, weight, dy)
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
    for (name, a), (_, b) in zip(first.named(), second.named()):
        assert torch.equal(a.view(bits), b.view(bits)), f"{name} changed bits"


def test_nan_poisoning_reaches_the_launchers():
    """The poisoning the other tests rely on: inside the block, the launchers' torch.empty
    returns NaNs; outside it, torch.empty is PyTorch's own again."""
    real_empty = torch.empty
    with nan_poisoned_empty():
        assert launch.torch.empty(8).isnan().all()
        assert launch.torch.empty((2, 3), dtype=torch.bfloat16).isnan().all()
    assert torch.empty is real_empty


def test_many_rows_dweight_error_grows_no_faster_than_sqrt_rows():
    kernel, eager, truth = _run_all(torch.float32, {}, True, shape=MANY_ROWS)
    assert_finite(kernel)
    assert_three_way(kernel, eager, truth, MANY_ROWS[0])
    # dweight's relative error stays near fp32 resolution times sqrt(rows).
    relative = (kernel.dweight.double() - truth.dweight).abs().max() / truth.dweight.abs().max()
    assert relative <= 4 * torch.finfo(torch.float32).eps * math.sqrt(MANY_ROWS[0])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("norm_before_gate", [True, False], ids=["norm_first", "gate_first"])
def test_hf_dweight_sums_the_rounded_normalized_value(dtype, norm_before_gate):
    # In the hf convention the weight multiplies n = R(h * rstd), so dweight = sum(dv * n). The
    # fp64 truth cannot see that rounding, and the composite's n can differ from the kernel's in
    # the odd element whose rstd differs in its last bit. So the expected dweight is built here
    # from the kernel's own rstd (returned by the registered forward op): n is then the kernel's
    # n exactly, and what is left is the order of the fp32 sums over positive terms.
    # An fp32 weight keeps dv = dy * act unrounded and dweight an fp32 sum.
    shape = (64, 128)
    x = (0.1 + torch.rand(shape)).to(dtype)
    gate = torch.randn(shape).to(dtype)
    weight = (1 + 0.2 * torch.randn(128)).float()
    dy = (0.1 + torch.rand(shape)).to(dtype)
    options = (1e-6, False, "sigmoid", norm_before_gate, 128, "hf")
    _, rstd = torch.ops.gatednorm.rms_norm_gated_fwd(x, gate, weight, *options)
    _, _, dweight = torch.ops.gatednorm.rms_norm_gated_bwd(dy, x, gate, weight, rstd,
                                                         *options)

    act = 1.0 / (1.0 + torch.exp(-gate.float()))  # the kernel's sigmoid
    h = x.float() if norm_before_gate else x.float() * act
    h_hat = h * rstd
    with working_dtype_rounding(dtype):
        n = h_hat.to(dtype).double()
    dv = (dy.float() * act if norm_before_gate else dy.float()).double()
    expected = (dv * n).sum(0)
    unrounded = (dv * h_hat.double()).sum(0)

    allowed = 8 * torch.finfo(torch.float32).eps * expected.abs().max().item()
    assert (unrounded - expected).abs().max().item() > 10 * allowed  # the test sees n's rounding
    difference = (dweight.double() - expected).abs().max().item()
    assert difference <= allowed, f"dweight is {difference:.3e} from sum(dv * n)"
