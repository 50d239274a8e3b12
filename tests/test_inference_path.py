"""Calls that need no gradient (decode, evaluation): after the first call of a signature, the
next ones go straight to a launcher bound to it (launch.inference_forward). They must give the
bits of the full path, never reach a launcher bound to another signature, and never be taken
by a call that needs a gradient."""

import pytest
import torch

import gatednorm
from gatednorm import GatedNormOptions, ops
from gatednorm.kernels import launch

from conftest import make_inputs, nan_poisoned_empty

pytestmark = pytest.mark.usefixtures("interpreter")

OPTIONS = dict(eps=1e-6, zero_centered_gamma=False, activation="silu", norm_before_gate=True,
               group_size=None, rounding="te")


@pytest.fixture(autouse=True)
def _fresh_plans():
    launch.clear_cache()
    yield
    launch.clear_cache()


def _full_path_y(x, gate, weight, **options):
    """y through the autograd.Function path (rstd stored), the reference for the bits."""
    checked = GatedNormOptions.checked(**{**OPTIONS, **options}).for_hidden_size(x.shape[-1])
    return ops.EagerRMSNormGated.apply(x, gate, weight, checked)


def _count_full_forwards(monkeypatch) -> list:
    calls = []
    real = launch.forward
    monkeypatch.setattr(launch, "forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


@pytest.mark.parametrize("grad_mode", ["no_grad", "inference_mode", "inputs_without_grad"])
def test_a_repeated_call_runs_its_bound_launcher_with_the_same_bits(monkeypatch, grad_mode):
    x, gate, weight, _ = make_inputs((3, 4, 64), torch.bfloat16)
    context = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}.get(
        grad_mode, torch.enable_grad)
    full_forwards = _count_full_forwards(monkeypatch)
    with context():
        with nan_poisoned_empty():
            first = gatednorm.rms_norm_gated(x, gate, weight, **OPTIONS)
            second = gatednorm.rms_norm_gated(x, gate, weight, **OPTIONS)
    assert len(full_forwards) == 1, "the second call must take the bound launcher"
    expected = _full_path_y(x, gate, weight).detach()
    assert torch.equal(first, expected) and torch.equal(second, expected)
    assert second.data_ptr() != first.data_ptr(), "each call returns a new output"


@pytest.mark.parametrize("change", ["sliced gate", "other eps", "fp32 weight", "no weight",
                                    "sigmoid", "groups", "other rows"])
def test_another_signature_gets_its_own_launcher(monkeypatch, change):
    x, gate, weight, _ = make_inputs((6, 64), torch.bfloat16)
    full_forwards = _count_full_forwards(monkeypatch)
    options = dict(OPTIONS)
    with torch.no_grad():
        gatednorm.rms_norm_gated(x, gate, weight, **options)
        if change == "sliced gate":
            gate = torch.cat([gate, gate], dim=-1)[:, 64:]
        elif change == "other eps":
            options["eps"] = 1e-2
        elif change == "fp32 weight":
            weight = weight.float()
        elif change == "no weight":
            weight = None
        elif change == "sigmoid":
            options["activation"] = "sigmoid"
        elif change == "groups":
            options["group_size"] = 16
        else:
            x, gate = x[:5], gate[:5]
        with nan_poisoned_empty():
            y = gatednorm.rms_norm_gated(x, gate, weight, **options)
            again = gatednorm.rms_norm_gated(x, gate, weight, **options)
    assert len(full_forwards) == 2, "one full forward per signature, then its launcher"
    expected = _full_path_y(x, gate, weight, **options).detach()
    assert torch.equal(y, expected) and torch.equal(again, expected)


def test_a_call_that_needs_a_gradient_never_takes_the_launcher():
    x, gate, weight, dy = make_inputs((4, 64), torch.bfloat16)
    with torch.no_grad():
        gatednorm.rms_norm_gated(x, gate, weight, **OPTIONS)
    weight.requires_grad_()
    y = gatednorm.rms_norm_gated(x, gate, weight, **OPTIONS)
    assert y.grad_fn is not None
    (dweight,) = torch.autograd.grad(y, weight, dy)
    assert torch.isfinite(dweight).all()


def test_a_non_unit_last_stride_is_copied_and_not_bound(monkeypatch):
    x, gate, weight, _ = make_inputs((4, 64), torch.bfloat16)
    strided_gate = torch.stack([gate, gate], dim=-1)[..., 0]  # last-dim stride 2
    full_forwards = _count_full_forwards(monkeypatch)
    with torch.no_grad():
        y = gatednorm.rms_norm_gated(x, strided_gate, weight, **OPTIONS)
        again = gatednorm.rms_norm_gated(x, strided_gate, weight, **OPTIONS)
    assert len(full_forwards) == 2, "a copied input must not be bound to a launcher"
    expected = _full_path_y(x, gate, weight).detach()
    assert torch.equal(y, expected) and torch.equal(again, expected)


def test_clearing_the_cache_drops_the_launchers(monkeypatch):
    x, gate, weight, _ = make_inputs((4, 64), torch.bfloat16)
    full_forwards = _count_full_forwards(monkeypatch)
    with torch.no_grad():
        gatednorm.rms_norm_gated(x, gate, weight, **OPTIONS)
        launch.clear_cache()
        y = gatednorm.rms_norm_gated(x, gate, weight, **OPTIONS)
    assert len(full_forwards) == 2
    assert torch.equal(y, _full_path_y(x, gate, weight).detach())
