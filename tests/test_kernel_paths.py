"""The same bits for the same call whatever path reaches the kernels.

Paths: the eager autograd.Function, the no-grad launch (first call) and its bound relaunch
(second call), the registered op called directly, the registered op as a tensor subclass
reaches it through rms_norm_gated (the DTensor exit), and the reference composite where the
convention allows bit equality under the interpreter (fp16 and fp32; bf16 is truncated by the
interpreter, so it is compared with the composite rounded the same way).
"""

import pytest
import torch

import gatednorm
from gatednorm import dispatch, ops
from gatednorm.kernels import launch

from conftest import composite, make_inputs, nan_poisoned_empty

pytestmark = pytest.mark.usefixtures("interpreter")

FWD = torch.ops.gatednorm.rms_norm_gated_fwd.default


class MarkedTensor(torch.Tensor):
    """A tensor subclass with no behaviour of its own: stands in for DTensor on the CPU."""


def _eager_grad(x, gate, weight, options):
    leaves = [t.clone().requires_grad_() for t in (x, gate, weight)]
    return gatednorm.rms_norm_gated(*leaves, **options).detach()


def _no_grad_first(x, gate, weight, options):
    launch.clear_cache()
    with torch.no_grad():
        return gatednorm.rms_norm_gated(x, gate, weight, **options)


def _no_grad_relaunch(x, gate, weight, options):
    with torch.no_grad():
        gatednorm.rms_norm_gated(x, gate, weight, **options)
        return gatednorm.rms_norm_gated(x, gate, weight, **options)


def _registered_op(x, gate, weight, options):
    checked = gatednorm.GatedNormOptions.checked(**options).for_hidden_size(x.shape[-1])
    return FWD(x, gate, weight, *checked)[0]


def _subclass(x, gate, weight, options):
    marked = [t.as_subclass(MarkedTensor) for t in (x, gate, weight)]
    y = gatednorm.rms_norm_gated(*marked, **options)
    assert type(y) is MarkedTensor
    return y.as_subclass(torch.Tensor)


PATHS = {"eager_autograd": _eager_grad, "no_grad_launch": _no_grad_first,
         "bound_relaunch": _no_grad_relaunch, "registered_op": _registered_op,
         "tensor_subclass": _subclass}
CASES = [
    pytest.param(torch.float16, dict(rounding="te"), id="fp16-te-norm_first"),
    pytest.param(torch.float32, dict(rounding="fp32", norm_before_gate=False, group_size=16),
                 id="fp32-fp32-gate_first-group16"),
    pytest.param(torch.bfloat16, dict(rounding="hf", activation="sigmoid",
                                      zero_centered_gamma=True), id="bf16-hf-sigmoid-zc"),
]


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("dtype, options", CASES)
def test_every_path_gives_the_eager_bits(path, dtype, options):
    x, gate, weight, dy = make_inputs((5, 3, 64), dtype,
                                      zero_centered_gamma=options.get("zero_centered_gamma",
                                                                      False))
    expected = _eager_grad(x, gate, weight, options)
    with nan_poisoned_empty():
        y = PATHS[path](x, gate, weight, options)
    assert y.dtype == dtype and y.shape == x.shape
    assert torch.equal(y, expected), f"{path} differs from the eager autograd path"
    # The composite, rounded as the kernels round on this machine: the same bits for fp16
    # and fp32 except where a reduction order flips a rounding (assert_matches_composite's
    # allowance); y equal on at least 99 % of the elements.
    reference = composite(x, gate, weight, dy, **options).y
    if dtype != torch.float32:
        assert (y == reference).double().mean() >= 0.99


def test_a_tensor_subclass_takes_the_registered_op_with_gradients(monkeypatch):
    calls = []
    real = ops.registered
    monkeypatch.setattr(ops, "registered", lambda *a: calls.append(1) or real(*a))
    x, gate, weight, dy = make_inputs((4, 32), torch.float16)
    plain = [t.clone().requires_grad_() for t in (x, gate, weight)]
    marked = [t.as_subclass(MarkedTensor).requires_grad_() for t in (x, gate, weight)]
    gatednorm.rms_norm_gated(*plain).backward(dy)
    assert not calls, "plain tensors take the eager path"
    gatednorm.rms_norm_gated(*marked).backward(dy.as_subclass(MarkedTensor))
    assert calls == [1]
    for name, a, b in zip(("dx", "dgate", "dweight"), plain, marked):
        assert torch.equal(a.grad, b.grad.as_subclass(torch.Tensor)), name


def test_subclass_calls_are_checked_every_time():
    x, gate, weight, _ = make_inputs((4, 32), torch.float16)
    assert dispatch.call_key(x.as_subclass(MarkedTensor), gate, weight,
                             (1e-6, False, "silu", True, None, "te")) is None
    with pytest.raises(ValueError, match="gate must have x's shape"):
        gatednorm.rms_norm_gated(x.as_subclass(MarkedTensor), gate[:, :16], weight)
