"""Accuracy of y, dx, dgate and dweight against the fp64 ground truth, on CUDA.

Every check is elementwise and aggregate (helpers.measure): the kernel's error against fp64 may
exceed twice the same-convention composite's error there (the composite in the working dtype is
the specification) by no more than TransformerEngine's test_rmsnorm_accuracy tolerance, and its
largest error may be at most twice the composite's largest plus a small slack (flash-attention's
3-way rule). Outputs start NaN-poisoned (helpers.poison_allocator), so an unwritten element fails.
"""

import math

import pytest
import torch

import gatednorm
from gatednorm import reference

from .helpers import (
    BF16,
    DTYPES,
    FP16,
    FP32,
    OPTION_SPACE,
    REALISTIC_CASES,
    Case,
    Options,
    accuracy_records,
    assert_accurate,
    forward_backward,
    heavy,
    make_inputs,
    measure_runs,
    requires_cuda,
    run_three,
)

pytestmark = [requires_cuda, pytest.mark.timeout(120)]


def check(case: Case, report, test: str, *, eps: float = 1e-6, x_scale: float = 1.0,
          gate_values=None):
    """Run ``case`` against the composite and fp64, record and assert its accuracy.
    ``gate_values(shape, dtype, device)``, when given, replaces the random gate."""
    inputs = make_inputs(case.shape, case.dtypes, case.options, layout=case.layout,
                         x_scale=x_scale)
    if gate_values is not None:
        inputs.gate.copy_(gate_values(case.shape, case.dtypes.gate, inputs.gate.device))
    runs = run_three(inputs, case.options, case.group_size, eps)
    results = measure_runs(runs, case.dtypes.x, inputs.rows)
    for record in accuracy_records("accuracy", test, case, results, inputs):
        report.add(**record)
    assert_accurate(results, f"{case.name} {case.options.id} {case.dtypes.id}")
    return runs


# Two small [T, H, D] shapes for the whole option space, the gate sliced out of a projection as
# in GDN: one group per row, and three groups of 128 per row. Both take 128-wide tiles over two
# leading dims, so they share each compiled kernel (and the bit-exact option space does too);
# a plain contiguous x and gate (one leading dim) runs in the other tests of this file.
SMALL_SHAPES = (
    pytest.param((199, 2, 128), None, "projection", id="199x2x128-sliced-gate"),
    pytest.param((7, 33, 384), 128, "projection", id="groups3x128-sliced-gate"),
)


@pytest.mark.parametrize("shape,group_size,layout", SMALL_SHAPES)
@pytest.mark.parametrize("dtypes", DTYPES, ids=lambda d: d.id)
@pytest.mark.parametrize("options", OPTION_SPACE, ids=lambda o: o.id)
def test_option_space(options, dtypes, shape, group_size, layout, report, request):
    """rounding x activation x norm order x weight (none / x dtype / fp32, zero-centered or
    not) x dtypes (bf16, fp16, fp32, bf16 x with an fp32 gate, fp32 x with a bf16 gate), with
    and without groups."""
    check(Case("option-space", shape, options, dtypes, group_size, layout), report,
          request.node.nodeid)


@heavy
@pytest.mark.parametrize("case", REALISTIC_CASES, ids=lambda c: c.name)
def test_realistic_sizes(case, report, request):
    """GDN 8192 x 32 x 128 with a sliced gate, 4096 x 5120 gate-first in groups of 1024,
    permuted [B, S, H, D] views, and rows of 65536 (the long-row kernels)."""
    check(case, report, request.node.nodeid)


ODD_OPTIONS = (
    Options("te"),
    Options("hf", activation="sigmoid", norm_before_gate=False, weight="fp32",
            zero_centered=True),
)


@pytest.mark.parametrize("options", ODD_OPTIONS, ids=lambda o: o.id)
@pytest.mark.parametrize("rows", (1, 199))
@pytest.mark.parametrize("d", (3, 80, 90, 100, 1536, 2048, 5000, 9000, 20000), ids=(
    "d3-narrow-tile", "d80", "d90-rows-aligned-2", "d100-rows-aligned-4",
    "d1536-partial-2048-tile", "d2048-four-warp-backward-tile", "d5000-one-row-tiles",
    "d9000-wide-tile-long-row-backward", "d20000-long-rows"))
def test_odd_shapes(d, rows, options, report, request):
    """Odd widths through each kernel path (gatednorm.kernels.config): 256-row tiles of 4
    columns, 16 x 128 tiles (rows starting at multiples of 8, 2 and 4 elements: 16-, 4- and
    8-byte vectors), the 2048-wide backward tile on four warps, whole and partial,
    one-row 8192-wide tiles, the one-row 16384-wide forward row loop with the backward cut into
    column blocks, and the long-row kernels both ways (forward looped, backward cut)."""
    check(Case(f"odd-{rows}x{d}", (rows, d), options), report, request.node.nodeid)


@pytest.mark.parametrize("d", (5000, 9000, 20000), ids=(
    "d5000-one-row-tiles", "d9000-wide-tile-long-row-backward", "d20000-long-rows"))
def test_fp32_wide_rows(d, report, request):
    """fp32 x, gate and weight double the backward's prefetch buffers: the widest tiles and
    the long-row loops must still launch (gatednorm.kernels.config.fit_shared_memory)."""
    check(Case(f"fp32-odd-64x{d}", (64, d), Options("fp32", weight="fp32"), FP32), report,
          request.node.nodeid)


@pytest.mark.parametrize("shape,group_size", (
    pytest.param((5, 27000), 9000, id="wide-tile-3-groups-of-9000"),
    pytest.param((3, 40000), 20000, id="long-row-2-groups-of-20000"),
))
@pytest.mark.parametrize("options", ODD_OPTIONS, ids=lambda o: o.id)
def test_large_groups(shape, group_size, options, report, request):
    check(Case(f"groups-{shape[1]}g{group_size}", shape, options, BF16, group_size), report,
          request.node.nodeid)


@pytest.mark.parametrize("eps", (1e-1, 1e-3, 1e-5, 1e-7, 0.0))
def test_eps(eps, report, request):
    check(Case(f"eps-{eps:g}", (199, 128), Options("te")), report, request.node.nodeid, eps=eps)


@pytest.mark.parametrize("shape", ((0, 128), (2, 0, 20000)), ids=("0x128", "2x0x20000"))
def test_zero_rows(shape):
    """No rows: empty outputs of the right shapes and dtypes, and a zero dweight."""
    options = Options("te", weight="fp32")
    inputs = make_inputs(shape, BF16, options)
    got = forward_backward(gatednorm.rms_norm_gated, inputs, options.kwargs())
    want = forward_backward(reference.rms_norm_gated, inputs, options.kwargs())
    for name in want:
        assert got[name].shape == want[name].shape and got[name].dtype == want[name].dtype, name
    assert torch.equal(got["dweight"], torch.zeros_like(got["dweight"]))


# One option set per rounding convention and gate order, for the edge-value tests.
EDGE_OPTIONS = (
    Options("te"),
    Options("fp32", weight="fp32"),
    Options("hf", norm_before_gate=False),
    Options("te", activation="sigmoid", norm_before_gate=False, weight="none"),
)


@pytest.mark.parametrize("options", EDGE_OPTIONS, ids=lambda o: o.id)
def test_fp16_large_magnitude(options, report, request):
    """x about 1000: x^2 overflows fp16 (max 65504), the fp32 statistics must not."""
    runs = check(Case("fp16-x1000", (199, 128), options, FP16), report, request.node.nodeid,
                 x_scale=1000.0)
    for name, tensor in runs.kernel.items():
        assert torch.isfinite(tensor).all(), f"{name} is not finite"


def saturated_gates(shape, dtype, device):
    """Gates across the whole range where act saturates: -100..100 in steps, with the values
    near -87.3 and -88.7 where 1 + exp(-g) passes 2**126 and overflows, and 0."""
    special = torch.tensor([-100.0, -88.5, -87.6, -87.4, -87.0, -60.0, -20.0, 0.0, 20.0, 88.5,
                            100.0])
    ramp = torch.linspace(-100.0, 100.0, math.prod(shape) - special.numel())
    return torch.cat([special, ramp]).reshape(shape).to(dtype=dtype, device=device)


@pytest.mark.parametrize("options", EDGE_OPTIONS, ids=lambda o: o.id)
@pytest.mark.parametrize("dtypes", (BF16, FP16), ids=lambda d: d.id)
def test_saturated_gates(options, dtypes, report, request):
    """|gate| up to 100: exp(-g) overflows, the activation saturates to 0 or g."""
    runs = check(Case("saturated-gates", (96, 128), options, dtypes), report,
                 request.node.nodeid, gate_values=saturated_gates)
    for name, tensor in runs.kernel.items():
        assert torch.isfinite(tensor).all(), f"{name} is not finite"


# Non-finite values: rows 3 (NaN), 10 (+inf) and 11 (-inf) carry one each; every other row is
# clean and must stay so (no leak through a shared tile or chunk).
NONFINITE_ROWS = {3: math.nan, 10: math.inf, 11: -math.inf}


@pytest.mark.parametrize("options", (
    Options("te"),
    Options("fp32", activation="sigmoid", norm_before_gate=False, weight="fp32"),
), ids=lambda o: o.id)
@pytest.mark.parametrize("where", ("x", "gate"))
@pytest.mark.parametrize("d", (128, 9000, 20000))
def test_nonfinite_propagates_as_in_reference(d, where, options):
    rows = 37
    inputs = make_inputs((rows, d), BF16, options)
    target = getattr(inputs, where)
    for row, value in NONFINITE_ROWS.items():
        target[row, (row * 7919) % d] = value
    kwargs = options.kwargs()
    kernel = forward_backward(gatednorm.rms_norm_gated, inputs, kwargs)
    composite = forward_backward(reference.rms_norm_gated, inputs, kwargs)

    # y: NaN and inf at the same places as the composite, the rest within two bf16 ulps.
    assert torch.equal(torch.isnan(kernel["y"]), torch.isnan(composite["y"])), "NaN positions"
    torch.testing.assert_close(kernel["y"], composite["y"], equal_nan=True, rtol=1.6e-2,
                               atol=1e-5)

    # Gradients of the clean rows are finite and agree with the composite.
    clean = torch.ones(rows, dtype=torch.bool, device=inputs.x.device)
    clean[list(NONFINITE_ROWS)] = False
    for name in ("dx", "dgate"):
        got, want = kernel[name][clean], composite[name][clean]
        assert torch.isfinite(got).all(), f"{name}: a non-finite value leaked into a clean row"
        torch.testing.assert_close(got.float(), want.float(), rtol=1.6e-2, atol=2e-2)
