"""GatedNormOptions: one frozen, hashable value for every option, checked once."""

import inspect

import pytest
import torch

import gatednorm
from gatednorm import GatedNormOptions, RMSNormGated


def test_defaults_are_rms_norm_gateds_defaults():
    keywords = inspect.signature(gatednorm.rms_norm_gated).parameters
    assert GatedNormOptions()._asdict() == {
        name: keywords[name].default for name in GatedNormOptions._fields}


def test_op_arguments_follow_the_registered_ops_schema():
    schema = torch.ops.gatednorm.rms_norm_gated_fwd.default._schema
    names = [a.name for a in schema.arguments][3:]
    options = GatedNormOptions.checked(eps=0.5, activation="sigmoid", group_size=4)
    assert options.op_arguments() == tuple(getattr(options, name) for name in names)


def test_equal_options_hash_equal_and_are_immutable():
    a = GatedNormOptions.checked(eps=1e-5, group_size=16, rounding="hf")
    b = GatedNormOptions.checked(eps=1e-5, group_size=16, rounding="hf")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != a._replace(rounding="te")
    with pytest.raises(AttributeError):
        a.eps = 1.0


def test_checked_normalizes_number_types():
    options = GatedNormOptions.checked(eps=1, group_size=torch.tensor(4).item())
    assert type(options.eps) is float and options.eps == 1.0
    assert type(options.group_size) is int


@pytest.mark.parametrize("bad, error, match", [
    (dict(eps=-1.0), ValueError, "eps"), (dict(eps="0"), TypeError, "eps"),
    (dict(activation="relu"), ValueError, "activation"),
    (dict(rounding="bf16"), ValueError, "rounding"),
    (dict(zero_centered_gamma=1), TypeError, "zero_centered_gamma"),
    (dict(norm_before_gate=None), TypeError, "norm_before_gate"),
    (dict(group_size=2.0), TypeError, "group_size"),
], ids=lambda v: next(iter(v)) if isinstance(v, dict) else None)
def test_checked_names_the_bad_option(bad, error, match):
    with pytest.raises(error, match=match):
        GatedNormOptions.checked(**bad)


def test_for_hidden_size_resolves_and_checks_the_group():
    assert GatedNormOptions.checked().for_hidden_size(48).group_size == 48
    assert GatedNormOptions.checked(group_size=16).for_hidden_size(48).group_size == 16
    with pytest.raises(ValueError, match="group_size must be a positive divisor"):
        GatedNormOptions.checked(group_size=5).for_hidden_size(48)


def test_module_holds_one_read_only_options_value():
    module = RMSNormGated(32, eps=1e-5, activation="sigmoid", group_size=8)
    assert module.options == GatedNormOptions.checked(eps=1e-5, activation="sigmoid",
                                                      group_size=8)
    assert (module.eps, module.activation, module.group_size) == (1e-5, "sigmoid", 8)
    with pytest.raises(AttributeError):
        module.eps = 1e-3
