"""Determinism: ten forward+backward runs on the same inputs give the same bits, for y, dx,
dgate and dweight (dweight: fp32 partials per fixed row chunk, reduced in a fixed order)."""

import pytest

import gatednorm

from .helpers import (
    BF16,
    BF16_GATE_FP32,
    Case,
    Options,
    forward_backward,
    make_inputs,
    poison_allocator,
    requires_cuda,
    same_bits,
)

pytestmark = [requires_cuda, pytest.mark.timeout(120)]

RUNS = 10

CASES = (
    Case("gdn-contiguous-gate", (2048, 32, 128), Options("te")),
    Case("gdn-sliced-gate", (2048, 32, 128), Options("te"), layout="projection"),
    Case("bshd-permuted", (2, 512, 16, 128), Options("hf", zero_centered=True),
         layout="permuted"),
    Case("full-width-gate-first-groups", (1024, 5120),
         Options("hf", norm_before_gate=False, weight="fp32"), BF16, 1024, "projection"),
    Case("one-row-tile-5000", (64, 5000), Options("fp32")),
    Case("wide-tile-9000-long-row-backward", (64, 9000), Options("hf", weight="fp32")),
    Case("long-row-20000", (16, 20000), Options("te", activation="sigmoid")),
    Case("long-row-20000-gate-first-gate32", (16, 20000),
         Options("te", norm_before_gate=False), BF16_GATE_FP32, None, "projection"),
)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_ten_runs_give_the_same_bits(case):
    inputs = make_inputs(case.shape, case.dtypes, case.options, layout=case.layout)
    kwargs = case.options.kwargs(case.group_size)
    first = forward_backward(gatednorm.rms_norm_gated, inputs, kwargs)
    assert set(first) == {"y", "dx", "dgate", "dweight"}
    for run in range(1, RUNS):
        # Fresh NaN-filled memory under each run's outputs: a run that skipped an element
        # would show NaN where the first run had a value.
        poison_allocator(4 * inputs.x.numel() * inputs.x.element_size(), inputs.x.device.type)
        again = forward_backward(gatednorm.rms_norm_gated, inputs, kwargs)
        changed = [name for name in first if not same_bits(first[name], again[name])]
        assert not changed, f"run {run} changed the bits of {changed}"
