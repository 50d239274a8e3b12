"""The long-row backward in one exchanging launch (variant 49, backward.EXCHANGE_PASS) against
the two launches it replaces and against fp64.

In the interpreter programs run one after another: every program but a group's last finds
blocks missing and computes their dot products itself (block_row_dot), the last reads the dots
the others published, so both paths run here; the GPU waits instead (tests/gpu/
test_gpu_exchange.py). Narrow column blocks (the long-row table patched to 128 or 256 columns,
groups wider than 256 cut) keep the interpreter fast with several blocks, a partial last block,
block counts that are not powers of two, and several chunks of rows."""

import pytest
import torch

import gatednorm
from gatednorm.kernels import config, launch

from conftest import (
    assert_finite,
    assert_three_way,
    composite,
    fp64_truth,
    fused,
    fused_on_views,
    make_inputs,
    rows_of,
)

pytestmark = pytest.mark.usefixtures("interpreter")


@pytest.fixture
def narrow_long_rows(monkeypatch, request):
    """Groups wider than 256 are long rows, cut into blocks of ``request.param`` columns."""
    monkeypatch.setattr(config, "BACKWARD_TILES", {128: (4, 1, 3), 256: (2, 1, 3)})
    monkeypatch.setattr(config, "BACKWARD_LONG_ROW", (request.param, 1, 2))
    # Few rows a chunk: several chunks (and arrival counters) even with few rows.
    monkeypatch.setattr(config, "MIN_ROWS_PER_CHUNK", 2)
    monkeypatch.setattr(config, "BACKWARD_TARGET_PROGRAMS", 24)
    monkeypatch.setattr(launch, "_PLANS", {})
    return request.param


def _both_ways(monkeypatch, run):
    """(two launches, exchange) results of ``run()``, checking the plans took those paths."""
    results = []
    for exchange in (False, True):
        monkeypatch.setattr(config, "BACKWARD_LONG_ROW_EXCHANGE", exchange)
        launch._PLANS.clear()
        results.append(run())
        plan = next(plan for key, plan in launch._PLANS.items() if key[0] == "bwd")
        assert plan.exchange == exchange and (plan.row_dots_meta is None) == exchange
    return results


@pytest.mark.parametrize("narrow_long_rows", [128, 256], indirect=True,
                         ids=lambda n: f"blocks_of_{n}")
@pytest.mark.parametrize("shape, group_size", [((7, 1000), None), ((5, 2, 640), None),
                                               ((6, 1200), 600)],
                         ids=["D1000-partial_last_block", "D640-five_blocks-3d",
                              "two_groups_of_600"])
@pytest.mark.parametrize("dtype, rounding", [(torch.float16, "te"), (torch.bfloat16, "hf"),
                                             (torch.float32, "fp32")],
                         ids=["fp16-te", "bf16-hf", "fp32-fp32"])
@pytest.mark.parametrize("norm_before_gate", [True, False], ids=["norm_first", "gate_first"])
def test_exchange_gives_the_two_launch_bits(monkeypatch, narrow_long_rows, shape, group_size,
                                            dtype, rounding, norm_before_gate):
    x, gate, weight, dy = make_inputs(shape, dtype)
    options = dict(group_size=group_size, rounding=rounding, norm_before_gate=norm_before_gate)
    cut, exchanged = _both_ways(monkeypatch, lambda: fused(x, gate, weight, dy, **options))
    assert_finite(exchanged)
    for name, value in exchanged.named():
        assert torch.equal(value, getattr(cut, name)), f"{name} differs from two launches"
    assert_three_way(exchanged, composite(x, gate, weight, dy, **options),
                     fp64_truth(x, gate, weight, dy, **options), rows_of(shape))


@pytest.mark.parametrize("narrow_long_rows", [256], indirect=True, ids=["blocks_of_256"])
@pytest.mark.parametrize("activation, has_weight, zero_centered",
                         [("sigmoid", True, True), ("silu", False, False)],
                         ids=["sigmoid-zero_centered", "no_weight"])
def test_exchange_with_a_sliced_gate(monkeypatch, narrow_long_rows, activation, has_weight,
                                     zero_centered):
    # The gate is the middle third of a projection (its own row offsets, two leading dims).
    tokens, heads, d = 3, 2, 700
    x, _, weight, dy = make_inputs((tokens, heads, d), torch.float16, has_weight=has_weight,
                                   zero_centered_gamma=zero_centered)
    proj = torch.randn(tokens, 3 * heads * d).to(torch.float16)
    gate = proj[:, heads * d:2 * heads * d].view(tokens, heads, d)
    options = dict(activation=activation, zero_centered_gamma=zero_centered, rounding="te")
    cut, exchanged = _both_ways(
        monkeypatch, lambda: fused_on_views(x, gate, weight, dy, **options))
    for name, value in exchanged.named():
        assert torch.equal(value, getattr(cut, name)), f"{name} differs from two launches"
    truth = fp64_truth(x, gate.contiguous(), weight, dy, **options)
    assert (exchanged.dx.double() - truth.dx).abs().max() < 2e-2


@pytest.fixture
def narrow_forward_exchange(monkeypatch, request):
    """Groups of 300 or more run the forward as exchanging blocks of ``request.param``."""
    monkeypatch.setattr(config, "FORWARD_EXCHANGE", (300, request.param, 1, 2, 24))
    monkeypatch.setattr(launch, "_PLANS", {})
    return request.param


@pytest.mark.parametrize("narrow_forward_exchange", [128, 256], indirect=True,
                         ids=lambda n: f"blocks_of_{n}")
@pytest.mark.parametrize("shape, group_size", [((7, 1000), None), ((5, 2, 640), None),
                                               ((6, 1200), 600), ((40, 384), None)],
                         ids=["D1000-partial_last_block", "D640-five_blocks-3d",
                              "two_groups_of_600", "D384-forty_rows_several_chunks"])
@pytest.mark.parametrize("dtype, rounding", [(torch.float16, "te"), (torch.bfloat16, "hf"),
                                             (torch.float32, "fp32")],
                         ids=["fp16-te", "bf16-hf", "fp32-fp32"])
@pytest.mark.parametrize("norm_before_gate", [True, False], ids=["norm_first", "gate_first"])
def test_forward_exchange_against_fp64(narrow_forward_exchange, shape, group_size, dtype,
                                       rounding, norm_before_gate):
    x, gate, weight, dy = make_inputs(shape, dtype)
    options = dict(group_size=group_size, rounding=rounding, norm_before_gate=norm_before_gate)
    result = fused(x, gate, weight, dy, **options)
    plan = next(plan for key, plan in launch._PLANS.items() if key[0] == "fwd")
    assert plan.exchange and plan.kernel.__name__ == "forward_exchange_kernel"
    assert_finite(result)
    assert_three_way(result, composite(x, gate, weight, dy, **options),
                     fp64_truth(x, gate, weight, dy, **options), rows_of(shape))


@pytest.mark.parametrize("narrow_forward_exchange", [128], indirect=True, ids=["blocks_of_128"])
def test_forward_exchange_without_rstd_and_with_a_sliced_gate(narrow_forward_exchange):
    # Inference (no rstd stored, not remembered as an inference launcher: the counters are
    # fresh every call) on a gate sliced from a projection; twice, to reuse the plan.
    tokens, heads, d = 4, 2, 500
    x = torch.randn(tokens, heads, d).to(torch.bfloat16)
    proj = torch.randn(tokens, 3 * heads * d).to(torch.bfloat16)
    gate = proj[:, heads * d:2 * heads * d].view(tokens, heads, d)
    weight = (1 + 0.2 * torch.randn(d)).to(torch.bfloat16)
    want = gatednorm.rms_norm_gated(x, gate.contiguous(), weight)
    with torch.no_grad():
        for _ in range(2):
            got = gatednorm.rms_norm_gated(x, gate, weight)
            assert torch.equal(got, want)
    truth = fp64_truth(x, gate.contiguous(), weight, torch.ones_like(x)).y
    # bf16 y (the interpreter truncates): a few bf16 ulps of each value.
    assert torch.allclose(want.double(), truth, rtol=3e-2, atol=1e-2)


@pytest.mark.parametrize("narrow_long_rows", [128], indirect=True, ids=["blocks_of_128"])
@pytest.mark.parametrize("narrow_forward_exchange", [128], indirect=True, ids=["blocks_of_128"])
def test_groups_of_more_blocks_than_run_side_by_side_keep_the_long_row_kernels(
        monkeypatch, narrow_long_rows, narrow_forward_exchange):
    # 1000 columns are 8 blocks of 128: over a limit of 4, neither pass exchanges (a wait on
    # more blocks than a GPU can hold at once would never end).
    monkeypatch.setattr(config, "EXCHANGE_MAX_BLOCKS", 4)
    monkeypatch.setattr(config, "BACKWARD_LONG_ROW_EXCHANGE", True)
    x, gate, weight, dy = make_inputs((3, 1000), torch.float16)
    result = fused(x, gate, weight, dy, rounding="te")
    plans = {key[0]: plan for key, plan in launch._PLANS.items()}
    assert not plans["fwd"].exchange  # the table's kernel for 1000 columns
    assert plans["fwd"].kernel.__name__ != "forward_exchange_kernel"
    assert not plans["bwd"].exchange and plans["bwd"].row_dots_meta is not None
    assert_three_way(result, composite(x, gate, weight, dy, rounding="te"),
                     fp64_truth(x, gate, weight, dy, rounding="te"), 3)
