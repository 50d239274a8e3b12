"""Every path into the kernels gives the same bits for the same call.

Paths through rms_norm_gated: the eager autograd.Function (forward and backward), the no-grad
launch of a new signature and the relaunch bound to it on the next call (the decode fast
path), the registered op called directly, and a tensor subclass, which takes the registered
op as DTensor does (gatednorm.dispatch). The traced launches (wrap_triton, what
torch.compile runs) are compared with the eager launches below them. Accuracy against fp64
and the composite is test_accuracy.py's; this file holds every path to the eager path's bits.
"""

import pytest
import torch

import gatednorm
from gatednorm import GatedNormOptions, dispatch, ops
from gatednorm.kernels import launch

from conftest import Result, forward_backward, make_inputs, nan_poisoned_empty

pytestmark = pytest.mark.usefixtures("interpreter")

FWD = torch.ops.gatednorm.rms_norm_gated_fwd.default


class MarkedTensor(torch.Tensor):
    """A tensor subclass with no behaviour of its own: stands in for DTensor on the CPU."""


def _registered_op(x, gate, weight, **options):
    checked = GatedNormOptions.checked(**options).for_hidden_size(x.shape[-1])
    y, rstd = FWD(x, gate, weight, *checked.op_arguments())
    assert rstd.shape == (*x.shape[:-1], x.shape[-1] // checked.group_size)
    assert rstd.dtype == torch.float32
    return y


def _as_subclass(fn):
    def run(x, gate, weight, **options):
        marked = [None if t is None else t.as_subclass(MarkedTensor) for t in (x, gate, weight)]
        y = fn(*marked, **options)
        assert type(y) is MarkedTensor
        return y.as_subclass(torch.Tensor)
    return run


def _no_grad(relaunch: bool):
    def run(x, gate, weight, **options):
        launch.clear_cache()
        with torch.no_grad():
            y = gatednorm.rms_norm_gated(x, gate, weight, **options)
            return gatednorm.rms_norm_gated(x, gate, weight, **options) if relaunch else y
    return run


def _plain_grads(result: Result) -> Result:
    return Result(*(None if t is None else t.as_subclass(torch.Tensor) for t in
                    (result.y, result.dx, result.dgate, result.dweight)))


# Paths that run a backward, and paths that need no gradient (y only).
GRAD_PATHS = {"registered_op": _registered_op,
              "tensor_subclass": _as_subclass(gatednorm.rms_norm_gated)}
NO_GRAD_PATHS = {"no_grad_launch": _no_grad(relaunch=False),
                 "bound_relaunch": _no_grad(relaunch=True)}

# (dtype, gate dtype, has weight, options)
CASES = [
    pytest.param(torch.float16, torch.float16, True, dict(rounding="te"),
                 id="fp16-te-norm_first"),
    pytest.param(torch.bfloat16, torch.float32, True,
                 dict(eps=1e-5, zero_centered_gamma=True, activation="sigmoid",
                      norm_before_gate=False, group_size=16, rounding="hf"),
                 id="bf16-fp32_gate-zero_centered-sigmoid-gate_first-group16-hf"),
    pytest.param(torch.float32, torch.float32, False,
                 dict(eps=0.0, group_size=8, rounding="fp32"), id="fp32-no_weight-group8-fp32"),
    pytest.param(torch.bfloat16, torch.bfloat16, True, dict(norm_before_gate=False),
                 id="bf16-gate_first-te"),
]


def _inputs(dtype, gate_dtype, has_weight, options):
    return make_inputs((5, 3, 32), dtype, gate_dtype=gate_dtype, has_weight=has_weight,
                       zero_centered_gamma=options.get("zero_centered_gamma", False))


@pytest.mark.parametrize("path", list(GRAD_PATHS) + list(NO_GRAD_PATHS))
@pytest.mark.parametrize("dtype, gate_dtype, has_weight, options", CASES)
def test_every_path_gives_the_eager_bits(path, dtype, gate_dtype, has_weight, options):
    x, gate, weight, dy = _inputs(dtype, gate_dtype, has_weight, options)
    eager = forward_backward(gatednorm.rms_norm_gated, x, gate, weight, dy, **options)
    with nan_poisoned_empty():
        if path in GRAD_PATHS:
            named = _plain_grads(forward_backward(GRAD_PATHS[path], x, gate, weight, dy,
                                                  **options)).named()
        else:
            named = [("y", NO_GRAD_PATHS[path](x, gate, weight, **options))]
    for name, a in named:
        b = getattr(eager, name)
        assert a.dtype == b.dtype and torch.equal(a, b), f"{name}: {path} differs from eager"


def test_a_tensor_subclass_takes_the_registered_op(monkeypatch):
    calls = []
    real = ops.registered
    monkeypatch.setattr(ops, "registered", lambda *a: calls.append(1) or real(*a))
    x, gate, weight, dy = make_inputs((4, 32), torch.float16)
    forward_backward(gatednorm.rms_norm_gated, x, gate, weight, dy)
    assert not calls, "plain tensors take the eager path"
    forward_backward(_as_subclass(gatednorm.rms_norm_gated), x, gate, weight, dy)
    assert calls == [1]


def test_a_tensor_subclass_is_checked_on_every_call():
    x, gate, weight, _ = make_inputs((4, 32), torch.float16)
    raw_options = tuple(GatedNormOptions())
    assert dispatch.call_key(x.as_subclass(MarkedTensor), gate, weight, raw_options) is None
    assert dispatch.call_key(x, gate, weight.as_subclass(MarkedTensor), raw_options) is None
    gatednorm.rms_norm_gated(x.as_subclass(MarkedTensor), gate, weight)
    with pytest.raises(ValueError, match="gate must have x's shape"):
        gatednorm.rms_norm_gated(x.as_subclass(MarkedTensor), gate[:, :16], weight)


@pytest.mark.parametrize("shape, group_size, sliced_gate", [
    pytest.param((6, 32), None, False, id="tile"),
    pytest.param((40, 96), None, True, id="row_loop-sliced_gate"),
    pytest.param((3, 20000), None, False, id="long_row"),
    pytest.param((2, 40000), 20000, True, id="long_row-two_groups-sliced_gate",
                 marks=pytest.mark.slow)])
def test_traced_launches_give_the_eager_launches_bits(shape, group_size, sliced_gate):
    """Inside torch.compile the kernels launch through wrap_triton (traceable=True) with
    their own flags (no inline-PTX store, no shared row offsets) and, for groups wider than a
    backward tile, as two launches over column blocks. On the CPU those launches run eagerly
    through the interpreter: they must give the eager path's bits."""
    torch.manual_seed(0)
    x, gate, weight, dy = make_inputs(shape, torch.float16)
    if sliced_gate:  # every tensor but the gate contiguous: the launchers' own offsets
        gate = torch.cat([gate, torch.randn(shape, dtype=torch.float16)], dim=-1)[..., :shape[-1]]
    options = dict(zero_centered_gamma=False, activation="silu", norm_before_gate=not sliced_gate,
                   group_size=group_size or shape[-1], rounding="te")
    results = []
    for traceable in (False, True):
        launch.clear_cache()
        with nan_poisoned_empty():  # outputs and scratch (the row dot products) start as NaN
            y, rstd = launch.forward(x, gate, weight, eps=1e-6, traceable=traceable, **options)
            grads = launch.backward(dy, x, gate, weight, rstd, eps=1e-6, traceable=traceable,
                                    **options)
        results.append((y, rstd, *grads))
    for name, eager, traced in zip(("y", "rstd", "dx", "dgate", "dweight"), *results):
        assert torch.equal(eager, traced), f"{name}: traced launch differs from eager"


def test_cpu_tensors_run_the_triton_kernels(monkeypatch):
    calls = []
    real_forward = launch.forward

    def spy(*args, **kwargs):
        calls.append(kwargs["rounding"])
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(launch, "forward", spy)
    x, gate, weight, _ = make_inputs((4, 32), torch.bfloat16)
    gatednorm.rms_norm_gated(x, gate, weight, rounding="hf")
    assert calls == ["hf"]



# ---------------------------------------------------------------------------------------------
# The decode fast path. Calls that need no gradient (decode, evaluation): after the first call
# of a signature, the next ones go straight to a launcher bound to it
# (launch.inference_launcher). They must give the bits of the full path, never reach a
# launcher bound to another signature, and never be taken by a call that needs a gradient.

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
