"""The registered torch.library ops under the compiler: opcheck, torch.compile(fullgraph)
with the eager path's bits, and no recompile across row counts (dynamic shapes).

Under TRITON_INTERPRET=1 the ops are registered as custom_op with explicit fake
implementations (wrap_triton cannot trace interpreted kernels); the same launchers run inside.
The other paths into the kernels are test_kernel_paths.py's.
"""

import shutil

import pytest
import torch

import gatednorm
from gatednorm import ops

from conftest import make_inputs

pytestmark = pytest.mark.usefixtures("interpreter")

FWD = torch.ops.gatednorm.rms_norm_gated_fwd.default
BWD = torch.ops.gatednorm.rms_norm_gated_bwd.default

# (dtype, gate dtype, has weight, eps, zero_centered_gamma, activation, norm_before_gate,
#  group_size, rounding)
OP_CASES = [
    pytest.param((torch.float16, torch.float16, True, 1e-6, False, "silu", True, None, "te"),
                 id="fp16-te-norm_first"),
    pytest.param((torch.bfloat16, torch.float32, True, 1e-5, True, "sigmoid", False, 16, "hf"),
                 id="bf16-fp32_gate-zero_centered-sigmoid-gate_first-group16-hf"),
    pytest.param((torch.float32, torch.float32, False, 0.0, False, "silu", True, 8, "fp32"),
                 id="fp32-no_weight-group8-fp32"),
    pytest.param((torch.bfloat16, torch.bfloat16, True, 1e-6, False, "silu", False, None, "te"),
                 id="bf16-gate_first-te"),
]


def _op_args(dtype, gate_dtype, has_weight, eps, zero_centered_gamma, activation,
             norm_before_gate, group_size, rounding, shape=(6, 32)):
    x, gate, weight, dy = make_inputs(shape, dtype, gate_dtype=gate_dtype,
                                      has_weight=has_weight,
                                      zero_centered_gamma=zero_centered_gamma)
    group = group_size or shape[-1]
    return (x, gate, weight, eps, zero_centered_gamma, activation, norm_before_gate, group,
            rounding), dy


@pytest.mark.parametrize("case", OP_CASES)
def test_opcheck_forward(case):
    args, _ = _op_args(*case)
    for t in args[:3]:
        if t is not None:
            t.requires_grad_()
    torch.library.opcheck(FWD, args)


@pytest.mark.parametrize("case", OP_CASES)
def test_opcheck_backward(case):
    args, dy = _op_args(*case)
    _, rstd = FWD(*args)
    x, gate, weight, *options = args
    torch.library.opcheck(BWD, (dy, x, gate, weight, rstd, *options))


def _loss_fn(options):
    def loss(x, gate, weight):
        y = gatednorm.rms_norm_gated(x, gate, weight, **options)
        return y, (y.float() * torch.linspace(-1, 1, y.shape[-1])).sum()
    return loss


def _run(fn, x, gate, weight):
    leaves = [t.clone().requires_grad_() for t in (x, gate, weight)]
    y, loss = fn(*leaves)
    loss.backward()
    return y.detach(), [t.grad for t in leaves]


# Inductor compiles the graph around the op (the loss) to C++ on CPU.
needs_cpp_compiler = pytest.mark.skipif(
    not any(shutil.which(c) for c in ("g++", "c++", "clang++")),
    reason="torch.compile's Inductor CPU backend needs a C++ compiler; none is on PATH")

COMPILE_OPTIONS = [
    pytest.param(dict(rounding="te"), id="te"),
    pytest.param(dict(rounding="hf", norm_before_gate=False, group_size=16,
                      activation="sigmoid"), id="hf-gate_first-group16-sigmoid"),
]


@needs_cpp_compiler
@pytest.mark.parametrize("options", COMPILE_OPTIONS)
def test_compile_fullgraph_forward_backward_matches_eager(options):
    torch._dynamo.reset()
    x, gate, weight, _ = make_inputs((2, 5, 32), torch.bfloat16)
    fn = _loss_fn(options)
    compiled = torch.compile(fn, fullgraph=True)
    y_c, grads_c = _run(compiled, x, gate, weight)
    y_e, grads_e = _run(fn, x, gate, weight)
    # The op is opaque to Inductor: the same kernels run, so the bits are the same.
    assert torch.equal(y_c, y_e)
    for name, a, b in zip(("dx", "dgate", "dweight"), grads_c, grads_e):
        assert torch.equal(a, b), f"{name}: compiled and eager differ"


@needs_cpp_compiler
def test_compile_dynamic_shapes_one_graph_for_two_row_counts():
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    fn = _loss_fn(dict(rounding="fp32", group_size=8))
    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend=counter)
    frames = []
    for rows in (7, 19):
        x, gate, weight, _ = make_inputs((rows, 32), torch.float16)
        y_c, grads_c = _run(compiled, x, gate, weight)
        y_e, grads_e = _run(fn, x, gate, weight)
        assert y_c.shape == (rows, 32) and torch.equal(y_c, y_e)
        for a, b in zip(grads_c, grads_e):
            assert torch.equal(a, b)
        frames.append(counter.frame_count)
    assert frames[0] >= 1 and frames[1] == frames[0], f"the second row count recompiled: {frames}"


def test_interpreter_registers_custom_ops_with_fake_impls():
    # The assumption the compile tests above rest on: on CPU the ops are custom_op, not
    # triton_op, and fake tensors propagate shapes without running a kernel.
    assert ops.INTERPRET
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(3, 4, 32, dtype=torch.bfloat16)
        y, rstd = FWD(x, x, None, 1e-6, False, "silu", True, 8, "te")
        assert y.shape == (3, 4, 32) and rstd.shape == (3, 4, 4)
        dx, dgate, dweight = BWD(x, x, x.float(), torch.empty(32), rstd, 1e-6, False, "silu", True,
                                 8, "te")
        assert dx.dtype == torch.bfloat16 and dgate.dtype == torch.float32
        assert dweight.shape == (32,) and dweight.dtype == torch.float32
