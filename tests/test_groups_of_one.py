"""Kernel paths the launch table cannot reach from the public API's usual shapes, run through
the interpreter against fp64: groups of one element (whose backward cancels in fp32)."""

import pytest
import torch

from gatednorm.kernels import launch

from conftest import Result, composite, fp64_truth, nan_poisoned_empty

pytestmark = pytest.mark.usefixtures("interpreter")

EPS = 1e-6
EPS32 = torch.finfo(torch.float32).eps


def _assert_elementwise_promise(kernel: Result, eager: Result, truth: Result) -> None:
    """Each element: |kernel - fp64| <= 2 |composite - fp64| + 4 ulp |fp64| + one ulp of the
    median |fp64| (where both formulas lose bits near a zero of the result). Elementwise, as
    the GPU suite's rule: the cancellation hits the smallest values, which a max-abs error
    over the tensor cannot see."""
    for (name, k), (_, e), (_, t) in list(zip(kernel.named(), eager.named(), truth.named()))[:3]:
        assert torch.isfinite(k).all(), f"{name} has non-finite elements"
        k, e = k.double(), e.double()
        allowed = 2 * (e - t).abs() + 4 * EPS32 * t.abs() + EPS32 * t.abs().median()
        excess = (k - t).abs() - allowed
        worst = excess.argmax()
        assert excess.max() <= 0, (
            f"{name}: kernel {k.flatten()[worst].item():.9e}, composite "
            f"{e.flatten()[worst].item():.9e}, fp64 {t.flatten()[worst].item():.9e}")


def _kernel(x, gate, weight, dy, eps, **options) -> Result:
    with nan_poisoned_empty():
        y, rstd = launch.forward(x, gate, weight, eps=EPS, traceable=False, **options)
        dx, dgate, dweight = launch.backward(dy, x, gate, weight, rstd, traceable=False, eps=eps,
                                             **options)
    return Result(y, dx, dgate, dweight)


@pytest.mark.parametrize("rounding", ["hf", "te"])
@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
@pytest.mark.parametrize("norm_before_gate", [True, False], ids=["norm_first", "gate_first"])
@pytest.mark.parametrize("d", [1, 8], ids=["D1", "D8-groups_of_1"])
def test_groups_of_one_element_keep_the_accuracy_promise(d, norm_before_gate, activation,
                                                         rounding):
    # A group of one: dh = rstd * dhhat * (1 - h_hat^2), and 1 - h_hat^2 = eps * rstd^2 is
    # about 1e-6 here, so forming it by subtraction in fp32 keeps only a few bits.
    x, gate, dy = (torch.randn(64, d) for _ in range(3))
    weight = 1 + 0.2 * torch.randn(d)
    options = dict(zero_centered_gamma=False, activation=activation,
                   norm_before_gate=norm_before_gate, group_size=1, rounding=rounding)
    kernel = _kernel(x, gate, weight, dy, EPS, **options)
    eager = composite(x, gate, weight, dy, eps=EPS, **options)
    truth = fp64_truth(x, gate, weight, dy, eps=EPS, **options)
    _assert_elementwise_promise(kernel, eager, truth)
