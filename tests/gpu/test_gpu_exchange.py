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


FORWARD_CASES = (
    Case("d16384-4096-rows", (4096, 16384), Options("te")),
    Case("d32768-fp16-gate-first", (1024, 32768), Options("hf", norm_before_gate=False), FP16),
    Case("d20000-partial-last-block-fp32", (256, 20000), Options("fp32"), FP32),
    Case("sliced-fp32-gate-333-rows", (333, 1, 16384), Options("te", weight="fp32"),
         BF16_GATE_FP32, None, "projection"),
)


@pytest.mark.parametrize("case", FORWARD_CASES, ids=lambda c: c.name)
def test_forward_exchange_is_deterministic_and_matches_the_long_row_forward(case,
                                                                            monkeypatch):
    # rstd sums the blocks' partial sums, so its last bit may differ from the one-program
    # forward; y within a 16-bit ulp or two, rstd within fp32 rounding of the sum's order.
    inputs = make_inputs(case.shape, case.dtypes, case.options, layout=case.layout)
    kwargs = case.options.kwargs(case.group_size)
    monkeypatch.setattr(launch, "_PLANS", {})
    monkeypatch.setattr(config, "FORWARD_EXCHANGE", None)
    want = forward_backward(gatednorm.rms_norm_gated, inputs, kwargs)
    launch._PLANS.clear()
    monkeypatch.setattr(config, "FORWARD_EXCHANGE", (16384, 4096, 8, 3, 1056))
    first = None
    for run in range(RUNS):
        poison_allocator(4 * inputs.x.numel() * inputs.x.element_size())
        got = forward_backward(gatednorm.rms_norm_gated, inputs, kwargs)
        forward_plan = next(p for key, p in launch._PLANS.items() if key[0] == "fwd")
        assert forward_plan.exchange, "the forward did not take the exchanging launch"
        if first is None:
            first = got
        changed = [name for name in first if not same_bits(got[name], first[name])]
        assert not changed, f"run {run}: {changed} changed bits"
    y, y_want = first["y"].double(), want["y"].double()
    ulp = torch.finfo(first["y"].dtype).eps
    assert ((y - y_want).abs() <= 2 * ulp * y_want.abs() + 1e-6).all()
