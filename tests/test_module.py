"""RMSNormGated: parameters, construction arguments, repr, forward, and float64 gradcheck."""

import itertools

import pytest
import torch

import gatednorm
from gatednorm import RMSNormGated, reference

from conftest import ACTIVATIONS, ROUNDINGS, make_inputs


def test_weight_starts_at_ones():
    module = RMSNormGated(48)
    assert module.weight.shape == (48,) and module.weight.dtype == torch.float32
    assert (module.weight == 1).all() and module.weight.requires_grad


def test_zero_centered_weight_starts_at_zeros():
    module = RMSNormGated(48, zero_centered_gamma=True)
    assert (module.weight == 0).all()


def test_reset_parameters_restores_the_initial_weight():
    module = RMSNormGated(8, zero_centered_gamma=True)
    with torch.no_grad():
        module.weight.normal_()
    module.reset_parameters()
    assert (module.weight == 0).all()


def test_state_dict_holds_only_the_weight():
    module = RMSNormGated(16, group_size=4)
    assert list(module.state_dict()) == ["weight"]
    other = RMSNormGated(16, group_size=4)
    with torch.no_grad():
        module.weight.normal_()
    other.load_state_dict(module.state_dict())
    assert torch.equal(other.weight, module.weight)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64], ids=str)
def test_dtype_keyword(dtype):
    assert RMSNormGated(8, dtype=dtype).weight.dtype == dtype


def test_device_keyword():
    module = RMSNormGated(8, device="meta", dtype=torch.bfloat16)
    assert module.weight.device.type == "meta" and module.weight.dtype == torch.bfloat16


def test_extra_repr_lists_every_option():
    module = RMSNormGated(64, eps=1e-5, zero_centered_gamma=True, activation="sigmoid",
                          norm_before_gate=False, group_size=16, rounding="hf")
    text = repr(module)
    assert text == ("RMSNormGated(64, eps=1e-05, zero_centered_gamma=True, activation='sigmoid', "
                    "norm_before_gate=False, group_size=16, rounding='hf')")


@pytest.mark.parametrize("hidden_size", [0, -3, 2.0, True, "8", None],
                         ids=["zero", "negative", "float", "bool", "str", "none"])
def test_bad_hidden_size_raises(hidden_size):
    with pytest.raises(ValueError, match="hidden_size must be a positive int"):
        RMSNormGated(hidden_size)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(group_size=5), ValueError, "group_size"),
    (dict(group_size=2.0), TypeError, "group_size"),
    (dict(activation="relu"), ValueError, "activation"),
    (dict(rounding="bf16"), ValueError, "rounding"),
    (dict(eps=-1.0), ValueError, "eps"),
    (dict(norm_before_gate="yes"), TypeError, "norm_before_gate"),
], ids=["group_size", "group_size_float", "activation", "rounding", "eps", "norm_before_gate"])
def test_bad_options_raise_at_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        RMSNormGated(16, **kwargs)


@pytest.mark.usefixtures("interpreter")
@pytest.mark.parametrize("zero_centered_gamma", [False, True], ids=["weight", "zero_centered"])
def test_forward_and_backward_equal_the_functional(zero_centered_gamma):
    options = dict(eps=1e-5, zero_centered_gamma=zero_centered_gamma, activation="sigmoid",
                   norm_before_gate=False, group_size=16, rounding="hf")
    module = RMSNormGated(64, **options, dtype=torch.bfloat16)
    with torch.no_grad():
        module.weight.normal_()
    x, gate, _, dy = make_inputs((3, 7, 64), torch.bfloat16)
    x_m, gate_m = x.clone().requires_grad_(), gate.clone().requires_grad_()
    y_module = module(x_m, gate_m)
    y_module.backward(dy)
    leaves = [t.clone().requires_grad_() for t in (x, gate, module.weight.detach())]
    y_functional = gatednorm.rms_norm_gated(*leaves, **options)
    y_functional.backward(dy)
    assert torch.equal(y_module, y_functional)
    assert torch.equal(x_m.grad, leaves[0].grad) and torch.equal(gate_m.grad, leaves[1].grad)
    assert torch.equal(module.weight.grad, leaves[2].grad)


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("norm_before_gate", [True, False], ids=["norm_first", "gate_first"])
def test_float64_module_runs_the_reference(rounding, norm_before_gate):
    module = RMSNormGated(32, rounding=rounding, norm_before_gate=norm_before_gate,
                          group_size=8, dtype=torch.float64)
    with torch.no_grad():
        module.weight.normal_()
    x, gate, _, _ = make_inputs((5, 32), torch.float64)
    expected = reference.rms_norm_gated(x, gate, module.weight, rounding=rounding,
                                        norm_before_gate=norm_before_gate, group_size=8)
    assert torch.equal(module(x, gate), expected)


def _gradcheck_cases():
    for rounding, activation, norm_before_gate, group_size, weight_kind in itertools.product(
            ROUNDINGS, ACTIVATIONS, (True, False), (None, 4), ("none", "weight", "zero_centered")):
        case_id = "-".join([rounding, activation,
                            "norm_first" if norm_before_gate else "gate_first",
                            f"group{group_size}" if group_size else "whole_row", weight_kind])
        yield pytest.param(rounding, activation, norm_before_gate, group_size, weight_kind,
                           id=case_id)


@pytest.mark.parametrize("rounding, activation, norm_before_gate, group_size, weight_kind",
                         list(_gradcheck_cases()))
def test_float64_gradcheck(rounding, activation, norm_before_gate, group_size, weight_kind):
    x, gate, weight, _ = make_inputs((3, 8), torch.float64,
                                     has_weight=weight_kind != "none",
                                     zero_centered_gamma=weight_kind == "zero_centered")
    inputs = [x.requires_grad_(), gate.requires_grad_()]
    if weight is not None:
        inputs.append(weight.requires_grad_())

    def fn(x, gate, weight=None):
        return gatednorm.rms_norm_gated(
            x, gate, weight, eps=1e-5, zero_centered_gamma=weight_kind == "zero_centered",
            activation=activation, norm_before_gate=norm_before_gate, group_size=group_size,
            rounding=rounding)

    assert torch.autograd.gradcheck(fn, inputs)
