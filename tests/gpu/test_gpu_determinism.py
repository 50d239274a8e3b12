"""Determinism: ten forward+backward runs on the same inputs give the same bits, for y, dx,
dgate and dweight (dweight: fp32 partials per fixed row chunk, reduced in a fixed order)."""

import pytest
import torch

import gatednorm
from gatednorm.kernels import config, launch

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


# Programmatic dependent launch (sm_90+, eager launches): the dweight reduction levels and
# the second launch of a cut group start while their predecessor runs and must wait for its
# writes. A missing wait would read partials or row dot products not yet written.
CHAINED_CASES = (
    Case("gdn-contiguous-gate", (4096, 32, 128), Options("te")),
    Case("full-width-gate-first-groups", (1024, 5120),
         Options("hf", norm_before_gate=False, weight="fp32"), BF16, 640, "projection"),
    Case("long-row-20000", (256, 20000), Options("te", weight="fp32")),
    Case("long-row-20000-no-weight", (256, 20000), Options("te", weight="none")),
)


def _poison_both_pools(nbytes: int) -> None:
    # Large outputs come from the allocator's large pool, the dweight partials (under 1 MB)
    # from its small pool: fill both with NaN before each run.
    poison_allocator(nbytes)
    blocks = [torch.empty(1 << 20, dtype=torch.uint8, device="cuda").fill_(0xFF)
              for _ in range(4)]
    del blocks


@pytest.mark.parametrize("case", CHAINED_CASES, ids=lambda c: c.name)
def test_programmatic_launch_gives_the_stream_order_bits(case, monkeypatch):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90 or newer: not used here")
    inputs = make_inputs(case.shape, case.dtypes, case.options, layout=case.layout)
    kwargs = case.options.kwargs(case.group_size)
    launch.clear_cache()
    monkeypatch.setattr(config, "BACKWARD_PROGRAMMATIC_LAUNCH", False)
    want = forward_backward(gatednorm.rms_norm_gated, inputs, kwargs)
    launch.clear_cache()
    monkeypatch.setattr(config, "BACKWARD_PROGRAMMATIC_LAUNCH", True)
    chained = forward_backward(gatednorm.rms_norm_gated, inputs, kwargs)
    (backward_plan,) = launch.cached_plans("bwd")
    assert backward_plan.reduce_launches is None or backward_plan.reduce_launches[0].meta[
        "WAIT_FOR_PRIOR_GRID"], "the plan does not chain its launches"
    for run in range(RUNS):
        if run:
            _poison_both_pools(4 * inputs.x.numel() * inputs.x.element_size())
            chained = forward_backward(gatednorm.rms_norm_gated, inputs, kwargs)
        changed = [name for name in want if not same_bits(chained[name], want[name])]
        assert not changed, f"run {run}: {changed} differ from plain stream order"
