"""The long-row backward in one exchanging launch (config.BACKWARD_LONG_ROW_EXCHANGE,
backward.EXCHANGE_PASS) against the two launches it replaces: the same bits for dx, dgate and
dweight (both sum each row's block dot products in block order, computed by the same
arithmetic), on every run. A program reading a dot product before its writer released it
would show as a changed dx; one waiting for an arrival that never comes, as a timeout."""

import pytest
import torch

import gatednorm
from gatednorm.kernels import config, launch

from .helpers import (
    BF16,
    BF16_GATE_FP32,
    FP16,
    FP32,
    Case,
    Options,
    forward_backward,
    make_inputs,
    poison_allocator,
    requires_cuda,
    same_bits,
)

pytestmark = [requires_cuda, pytest.mark.timeout(120)]

RUNS = 5

CASES = (
    # Many rows: hundreds of programs waiting on each other at once, several to an SM.
    Case("d16384-4096-rows", (4096, 16384), Options("te")),
    Case("d32768-fp16-sigmoid", (1024, 32768), Options("hf", activation="sigmoid"), FP16),
    Case("d20000-partial-last-block-fp32", (256, 20000), Options("fp32"), FP32),
    Case("gate-first-sliced-fp32-gate", (512, 2, 16384),
         Options("te", norm_before_gate=False, weight="fp32"), BF16_GATE_FP32, None,
         "projection"),
    Case("no-weight-333-rows", (333, 16384), Options("te", weight="none"), BF16),
    Case("d49152-three-groups-of-16384", (96, 49152), Options("te", zero_centered=True),
         BF16, 16384),
)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_exchange_gives_the_two_launch_bits(case, monkeypatch):
    inputs = make_inputs(case.shape, case.dtypes, case.options, layout=case.layout)
    kwargs = case.options.kwargs(case.group_size)
    monkeypatch.setattr(launch, "_PLANS", {})
    monkeypatch.setattr(config, "BACKWARD_LONG_ROW_EXCHANGE", False)
    want = forward_backward(gatednorm.rms_norm_gated, inputs, kwargs)
    launch._PLANS.clear()
    monkeypatch.setattr(config, "BACKWARD_LONG_ROW_EXCHANGE", True)
    for run in range(RUNS):
        poison_allocator(4 * inputs.x.numel() * inputs.x.element_size())
        got = forward_backward(gatednorm.rms_norm_gated, inputs, kwargs)
        backward_plan = next(p for key, p in launch._PLANS.items() if key[0] == "bwd")
        assert backward_plan.exchange, "the backward did not take the exchanging launch"
        changed = [name for name in want if not same_bits(got[name], want[name])]
        assert not changed, f"run {run}: {changed} differ from the two-launch backward"
