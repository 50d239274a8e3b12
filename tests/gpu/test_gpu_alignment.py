"""y's bits for the same rows whatever the path (eager, inference, torch.compile) and the
pointers' alignment; dx's and dgate's whatever the path.

A compiled call reaches the same kernels through Inductor, which passes a Python float (eps)
as fp64 where Triton's launcher passes fp32, and specializes the integer arguments on their
values where the eager launch does not. The kernels convert eps to fp32 first and state the
alignment of every row offset (tests/test_compiled_float_arguments.py checks, without a GPU,
that both compilations run the same float operations in the same reduction layouts).
"""

import pytest
import torch

import gatednorm

from .helpers import requires_cuda

pytestmark = [requires_cuda, pytest.mark.timeout(240)]

CASES = {
    "gdn128": ((4096, 32, 128), None, dict(norm_before_gate=True)),
    "mamba2_640": ((8192, 5120), 640, dict(norm_before_gate=False)),
}


def _inputs(shape, offset: int):
    """x and gate (bf16) ``offset`` elements into their buffers, and a weight."""
    n = torch.Size(shape).numel()
    buffers = [torch.randn(n + 8, device="cuda").to(torch.bfloat16) for _ in range(2)]
    x, gate = (b[offset:offset + n].view(shape) for b in buffers)
    weight = (1 + 0.2 * torch.randn(shape[-1], device="cuda")).to(torch.bfloat16)
    return x, gate, weight


def _y(fn, x, gate, weight, group_size, options):
    with torch.no_grad():
        return fn(x, gate, weight, group_size=group_size, **options)


@pytest.mark.parametrize("case", CASES)
def test_inference_and_training_forwards_agree_bitwise(case):
    shape, group_size, options = CASES[case]
    x, gate, weight = _inputs(shape, 0)
    inference = _y(gatednorm.rms_norm_gated, x, gate, weight, group_size, options)
    training = gatednorm.rms_norm_gated(x, gate, weight.requires_grad_(), group_size=group_size,
                                        **options).detach()
    assert torch.equal(inference.view(torch.int16), training.view(torch.int16))


@pytest.mark.parametrize("case", CASES)
def test_compiled_forward_matches_eager_bitwise(case):
    shape, group_size, options = CASES[case]
    x, gate, weight = _inputs(shape, 0)
    eager = _y(gatednorm.rms_norm_gated, x, gate, weight, group_size, options)
    compiled = _y(torch.compile(gatednorm.rms_norm_gated, fullgraph=True), x, gate, weight,
                  group_size, options)
    assert torch.equal(eager.view(torch.int16), compiled.view(torch.int16))


@pytest.mark.parametrize("case", CASES)
def test_compiled_backward_matches_eager_bitwise(case):
    shape, group_size, options = CASES[case]
    x, gate, weight = _inputs(shape, 0)
    dy = torch.randn(shape, device="cuda").to(torch.bfloat16)

    def grads(fn):
        leaves = [t.detach().clone().requires_grad_() for t in (x, gate)]
        fn(*leaves, weight, group_size=group_size, **options).backward(dy)
        return [t.grad for t in leaves]

    eager = grads(gatednorm.rms_norm_gated)
    compiled = grads(torch.compile(gatednorm.rms_norm_gated, fullgraph=True))
    for want, got in zip(eager, compiled):
        assert torch.equal(want.view(torch.int16), got.view(torch.int16))


@pytest.mark.parametrize("case", CASES)
def test_misaligned_inputs_give_the_aligned_bits(case):
    shape, group_size, options = CASES[case]
    aligned = _inputs(shape, 0)
    # The same values one element (2 bytes) into their buffers.
    misaligned = _inputs(shape, 1)
    for a, m in zip(aligned, misaligned):
        m.copy_(a)
    want = _y(gatednorm.rms_norm_gated, *aligned, group_size, options)
    got = _y(gatednorm.rms_norm_gated, *misaligned, group_size, options)
    assert torch.equal(want.view(torch.int16), got.view(torch.int16))
