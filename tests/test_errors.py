"""Bad arguments raise a ValueError or TypeError that names the argument; empty inputs work."""

import math

import pytest
import torch

import gatednorm

from conftest import fused, make_inputs


def _inputs(shape=(4, 16), dtype=torch.bfloat16):
    x, gate, weight, _ = make_inputs(shape, dtype)
    return x, gate, weight


def test_gate_shape_must_match_x():
    x, _, weight = _inputs()
    with pytest.raises(ValueError, match=r"gate must have x's shape \(4, 16\), got \(4, 8\)"):
        gatednorm.rms_norm_gated(x, torch.randn(4, 8).bfloat16(), weight)


def test_broadcastable_gate_is_still_a_shape_mismatch():
    x, _, weight = _inputs()
    with pytest.raises(ValueError, match="gate must have x's shape"):
        gatednorm.rms_norm_gated(x, torch.randn(1, 16).bfloat16(), weight)


@pytest.mark.parametrize("shape", [(8,), (16, 1), (4, 16), ()], ids=["8", "16x1", "4x16", "0d"])
def test_weight_shape_must_be_the_last_dim(shape):
    x, gate, _ = _inputs()
    with pytest.raises(ValueError, match=r"weight must have shape \(16,\)"):
        gatednorm.rms_norm_gated(x, gate, torch.ones(shape, dtype=torch.bfloat16))


@pytest.mark.parametrize("group_size", [5, 32, 0, -4], ids=lambda g: f"group{g}")
def test_group_size_must_be_a_positive_divisor(group_size):
    x, gate, weight = _inputs()
    with pytest.raises(ValueError, match=r"group_size must be a positive divisor .*16.*got "
                                         + str(group_size)):
        gatednorm.rms_norm_gated(x, gate, weight, group_size=group_size)


@pytest.mark.parametrize("group_size", [True, 4.0, "4"], ids=["bool", "float", "str"])
def test_group_size_must_be_an_int(group_size):
    x, gate, weight = _inputs()
    with pytest.raises(TypeError, match="group_size must be an int or None"):
        gatednorm.rms_norm_gated(x, gate, weight, group_size=group_size)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.complex64,
                                   torch.uint8], ids=str)
def test_x_dtype_must_be_floating(dtype):
    x = torch.ones(4, 16, dtype=dtype)
    with pytest.raises(TypeError, match="x must be bfloat16, float16, float32 or float64"):
        gatednorm.rms_norm_gated(x, x)


@pytest.mark.parametrize("x_dtype, gate_dtype", [
    (torch.bfloat16, torch.float64), (torch.float32, torch.float64),
    (torch.bfloat16, torch.int32), (torch.bfloat16, torch.bool), (torch.bfloat16, torch.complex64),
    (torch.float64, torch.float32), (torch.float64, torch.bfloat16),
], ids=lambda d: str(d).replace("torch.", ""))
def test_gate_dtype_must_be_16_bit_or_float32_or_match_float64_x(x_dtype, gate_dtype):
    x = torch.randn(4, 16).to(x_dtype)
    gate = torch.ones(4, 16, dtype=gate_dtype)
    with pytest.raises(TypeError, match="gate must be"):
        gatednorm.rms_norm_gated(x, gate)


@pytest.mark.parametrize("x_dtype, weight_dtype", [
    (torch.bfloat16, torch.float64), (torch.bfloat16, torch.int32), (torch.float16, torch.bool),
    (torch.float64, torch.float32),
], ids=lambda d: str(d).replace("torch.", ""))
def test_weight_dtype_must_be_16_bit_or_float32_or_match_float64_x(x_dtype, weight_dtype):
    x = torch.randn(4, 16).to(x_dtype)
    with pytest.raises(TypeError, match=r"weight must be .*\(x is "):
        gatednorm.rms_norm_gated(x, x, torch.ones(16, dtype=weight_dtype))


@pytest.mark.parametrize("gate_dtype", [torch.bfloat16, torch.float16, torch.float32],
                         ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16, torch.float32],
                         ids=lambda d: str(d).replace("torch.", ""))
def test_every_16_bit_or_float32_gate_and_weight_is_accepted(x_dtype, gate_dtype):
    # gate and weight need not share x's dtype (an fp32 gate or master weight beside bf16
    # activations, a bf16 gate beside an fp32 scan output); only float64 x, the reference
    # path, asks for matching dtypes. Meta tensors: the checks run, no kernel does.
    x = torch.randn(4, 16, device="meta", dtype=x_dtype)
    y = gatednorm.rms_norm_gated(x, x.to(gate_dtype), torch.ones(16, dtype=gate_dtype,
                                                                 device="meta"))
    assert y.shape == (4, 16) and y.dtype == x_dtype


def test_gate_on_another_device():
    x, gate, weight = _inputs()
    with pytest.raises(ValueError, match="gate must be on x's device cpu, got meta"):
        gatednorm.rms_norm_gated(x, gate.to("meta"), weight)


def test_weight_on_another_device():
    x, gate, weight = _inputs()
    with pytest.raises(ValueError, match="weight must be on x's device cpu, got meta"):
        gatednorm.rms_norm_gated(x, gate, weight.to("meta"))


@pytest.mark.parametrize("activation", ["gelu", "swish", "SiLU", None])
def test_unknown_activation(activation):
    x, gate, weight = _inputs()
    with pytest.raises(ValueError, match="activation must be one of"):
        gatednorm.rms_norm_gated(x, gate, weight, activation=activation)


@pytest.mark.parametrize("rounding", ["bf16", "TE", "", None])
def test_unknown_rounding(rounding):
    x, gate, weight = _inputs()
    with pytest.raises(ValueError, match="rounding must be one of"):
        gatednorm.rms_norm_gated(x, gate, weight, rounding=rounding)


@pytest.mark.parametrize("eps", [-1e-6, math.nan, math.inf], ids=["negative", "nan", "inf"])
def test_eps_must_be_finite_and_non_negative(eps):
    x, gate, weight = _inputs()
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        gatednorm.rms_norm_gated(x, gate, weight, eps=eps)


@pytest.mark.parametrize("eps", [True, "1e-6", torch.tensor(1e-6)], ids=["bool", "str", "tensor"])
def test_eps_must_be_a_number(eps):
    x, gate, weight = _inputs()
    with pytest.raises(TypeError, match="eps must be a float"):
        gatednorm.rms_norm_gated(x, gate, weight, eps=eps)


@pytest.mark.parametrize("flag", ["zero_centered_gamma", "norm_before_gate"])
def test_flags_must_be_bools(flag):
    x, gate, weight = _inputs()
    with pytest.raises(TypeError, match=f"{flag} must be a bool"):
        gatednorm.rms_norm_gated(x, gate, weight, **{flag: 1})


def test_zero_centered_gamma_needs_a_weight():
    x, gate, _ = _inputs()
    with pytest.raises(ValueError, match="zero_centered_gamma=True needs a weight"):
        gatednorm.rms_norm_gated(x, gate, None, zero_centered_gamma=True)


def test_x_must_not_be_0d():
    x = torch.tensor(1.0)
    with pytest.raises(ValueError, match=r"x must have shape \[\.\.\., D\] with D >= 1"):
        gatednorm.rms_norm_gated(x, x)


def test_last_dim_must_not_be_empty():
    x = torch.randn(4, 0)
    with pytest.raises(ValueError, match=r"x must have shape .*D >= 1, got \(4, 0\)"):
        gatednorm.rms_norm_gated(x, x)


@pytest.mark.parametrize("argument", ["x", "gate", "weight"])
def test_non_tensor_arguments(argument):
    x, gate, weight = _inputs()
    arguments = dict(x=x, gate=gate, weight=weight)
    arguments[argument] = arguments[argument].tolist()
    with pytest.raises(TypeError, match=f"{argument} must be a torch.Tensor"):
        gatednorm.rms_norm_gated(arguments["x"], arguments["gate"], arguments["weight"])


@pytest.mark.parametrize("shape", [(0, 16), (2, 0, 16), (0, 3, 16)], ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.usefixtures("interpreter")
def test_zero_rows_give_an_empty_result_and_zero_dweight(shape, dtype):
    x, gate, weight, dy = make_inputs(shape, dtype)
    result = fused(x, gate, weight, dy, group_size=8)
    assert result.y.shape == shape and result.y.dtype == dtype
    assert result.dx.shape == shape and result.dgate.shape == shape
    # A sum over no rows is zero, not uninitialized memory (the outputs are NaN-poisoned).
    assert result.dweight.shape == (16,) and (result.dweight == 0).all()


@pytest.mark.usefixtures("interpreter")
def test_zero_rows_without_weight():
    x, gate, _, dy = make_inputs((0, 16), torch.float16, has_weight=False)
    result = fused(x, gate, None, dy)
    assert result.y.shape == (0, 16) and result.dx.shape == (0, 16)


@pytest.mark.usefixtures("interpreter")
@pytest.mark.parametrize("leading", [(2**31,), (2**16, 2**15), (3, 2**30)],
                         ids=["one-dim", "two-dims", "three-times-2^30"])
def test_more_than_2_31_rows_are_refused_before_any_allocation(leading):
    # Expanded views: 2**31 rows of 16 elements without the memory behind them. The check
    # must come before the output (tens of GB here) is allocated.
    x = torch.randn(1, 16).bfloat16().expand(*leading, 16)
    gate = torch.randn(1, 16).bfloat16().expand(*leading, 16)
    rows = math.prod(leading)
    with pytest.raises(ValueError, match=rf"x must have at most 2147483647 rows .*got {rows}"):
        gatednorm.rms_norm_gated(x, gate, None)


@pytest.mark.usefixtures("interpreter")
def test_2_31_minus_1_rows_pass_the_row_check():
    from gatednorm.validation import MAX_KERNEL_ROWS, check_kernel_rows

    check_kernel_rows(torch.empty(1, 16).expand(MAX_KERNEL_ROWS, 16))


# The checks run once per argument signature (cached in launch.cached); a bad call must raise
# even right after a good call with the same tensors.
_GOOD = dict(eps=1e-6, zero_centered_gamma=True, activation="silu", norm_before_gate=True,
             group_size=8, rounding="te")


@pytest.mark.parametrize("bad, error", [
    (dict(eps=float("nan")), ValueError),
    (dict(eps=-1e-6), ValueError),
    (dict(eps=True), TypeError),
    (dict(zero_centered_gamma=1), TypeError),
    (dict(norm_before_gate=0), TypeError),
    (dict(group_size=True), TypeError),
    (dict(group_size=8.0), TypeError),
    (dict(group_size=5), ValueError),
    (dict(activation=["silu"]), ValueError),
    (dict(activation="relu"), ValueError),
    (dict(rounding="bf16"), ValueError),
], ids=lambda v: next(iter(v)) + "=" + repr(next(iter(v.values()))) if isinstance(v, dict)
    else v.__name__)
def test_a_bad_option_raises_after_a_good_call_with_the_same_tensors(bad, error):
    x, gate, weight = _inputs()
    gatednorm.rms_norm_gated(x, gate, weight, **_GOOD)
    with pytest.raises(error):
        gatednorm.rms_norm_gated(x, gate, weight, **{**_GOOD, **bad})


@pytest.mark.parametrize("change", ["gate dtype", "gate shape", "weight dtype", "weight shape",
                                    "no weight", "weight a list", "x a list"])
def test_a_bad_tensor_raises_after_a_good_call(change):
    x, gate, weight = _inputs()
    gatednorm.rms_norm_gated(x, gate, weight, **_GOOD)
    if change == "gate dtype":
        gate = gate.to(torch.int32)
    elif change == "gate shape":
        gate = gate[:, :8]
    elif change == "weight dtype":
        weight = weight.to(torch.float64)
    elif change == "weight shape":
        weight = weight[:8]
    elif change == "no weight":
        weight = None  # with zero_centered_gamma=True
    elif change == "weight a list":
        weight = weight.tolist()
    else:
        x = x.tolist()
    with pytest.raises((TypeError, ValueError)):
        gatednorm.rms_norm_gated(x, gate, weight, **_GOOD)


def test_the_checks_run_once_per_signature(monkeypatch):
    from gatednorm import dispatch
    from gatednorm.kernels import launch

    calls = []
    real_check = dispatch._check
    monkeypatch.setattr(dispatch, "_check", lambda *a: calls.append(1) or real_check(*a))
    launch.clear_cache()
    x, gate, weight = _inputs((3, 16))
    for _ in range(3):
        gatednorm.rms_norm_gated(x, gate, weight, **_GOOD)
    assert len(calls) == 1
    gatednorm.rms_norm_gated(x[:2], gate[:2], weight, **_GOOD)  # another shape
    gatednorm.rms_norm_gated(x, gate, weight, **{**_GOOD, "eps": 1e-5})  # another eps
    gatednorm.rms_norm_gated(x, gate, weight.float(), **_GOOD)  # another weight dtype
    assert len(calls) == 4
