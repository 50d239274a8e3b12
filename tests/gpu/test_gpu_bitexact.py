"""Bit-exactness against gatednorm.reference, each rounding convention, on CUDA.

The composite runs on the GPU in the working dtype on the same inputs. y and dgate (16-bit, gate
after the norm; helpers.bitexact_tensors says why gate-first dgate is not held to it) must be
bit-identical in at least MIN_FRACTION_IDENTICAL of the elements and within MAX_ULP everywhere;
dx and dweight, whose fp32 reductions are written differently from autograd's, must be within
TransformerEngine's tolerances of fp64 (helpers.measure). Every (case, tensor) writes one record
with fraction_identical and max_ulp to the JSON-lines report, passing or not.
"""

import pytest
import torch

import gatednorm

from .helpers import (
    BF16,
    BF16_GATE_FP32,
    DTYPES,
    FP16,
    FP32_GATE_BF16,
    OPTION_SPACE,
    REALISTIC_CASES,
    Case,
    Options,
    accuracy_records,
    bitexact_failures,
    bitexact_tensors,
    heavy,
    forward_backward,
    make_inputs,
    measure_runs,
    requires_cuda,
    run_three,
    same_bits,
)

pytestmark = [requires_cuda, pytest.mark.timeout(120)]

# 1M elements: a fraction of 0.999 is measured over about 1000 differing elements.
OPTION_SPACE_SHAPE = (1024, 8, 128)


def check_bitexact(case: Case, report, test: str) -> None:
    inputs = make_inputs(case.shape, case.dtypes, case.options, layout=case.layout)
    runs = run_three(inputs, case.options, case.group_size)
    results = measure_runs(runs, case.dtypes.x, inputs.rows)
    for record in accuracy_records("bitexact", test, case, results, inputs):
        report.add(**record)
    failures = bitexact_failures(results, case.options, case.dtypes)
    held = bitexact_tensors(case.options, case.dtypes)
    failures += [r.describe() for name, r in results.items() if name not in held and not r.ok]
    assert not failures, f"{case.name} {case.options.id} {case.dtypes.id}:\n  " + "\n  ".join(
        failures)


@pytest.mark.parametrize("dtypes", DTYPES, ids=lambda d: d.id)
@pytest.mark.parametrize("options", OPTION_SPACE, ids=lambda o: o.id)
def test_option_space(options, dtypes, report, request):
    check_bitexact(Case("option-space", OPTION_SPACE_SHAPE, options, dtypes,
                        layout="projection"), report, request.node.nodeid)


@heavy
@pytest.mark.parametrize("case", REALISTIC_CASES, ids=lambda c: c.name)
def test_realistic_sizes(case, report, request):
    check_bitexact(case, report, request.node.nodeid)


@pytest.mark.parametrize("case", (
    Case("tile-d128", (199, 128), Options("te")),
    Case("row-loop-d96", (199, 96), Options("hf", activation="sigmoid")),
    Case("row-loop-d192-fp16-sliced-gate", (40001, 192), Options("te"), FP16,
         layout="projection"),
    Case("fp32-d96-bf16-gate", (199, 96), Options("fp32"), FP32_GATE_BF16),
    Case("bf16-d192-fp32-gate", (199, 192), Options("te", norm_before_gate=False),
         BF16_GATE_FP32),
    Case("tile-groups-sliced-gate", (7, 33, 384), Options("hf", norm_before_gate=False), FP16,
         128, "projection"),
    Case("one-row-tiles-d5000", (9, 5000), Options("fp32", weight="fp32")),
    Case("wide-tile-d9000", (9, 9000), Options("te", activation="sigmoid", zero_centered=True)),
    Case("long-row-d20000", (3, 20000), Options("hf", weight="none")),
), ids=lambda c: c.name)
def test_inference_forward_matches_training_forward(case):
    """Without autograd the forward skips storing rstd (its own kernel variant): y must keep
    the bits of the forward that saves rstd for a backward."""
    inputs = make_inputs(case.shape, case.dtypes, case.options, layout=case.layout)
    kwargs = case.options.kwargs(case.group_size)
    training = forward_backward(gatednorm.rms_norm_gated, inputs, kwargs)["y"]
    with torch.no_grad():
        inference = gatednorm.rms_norm_gated(inputs.x, inputs.gate, inputs.weight, **kwargs)
    assert same_bits(inference, training)


@pytest.mark.usefixtures("decode_tile")
@pytest.mark.parametrize("dtypes", (BF16, FP16, FP32_GATE_BF16, BF16_GATE_FP32),
                         ids=lambda d: d.id)
# Every seventh combination: each rounding, activation, order and weight variant appears; the
# tile changes only which programs own which rows, not the arithmetic the options select.
@pytest.mark.parametrize("options", OPTION_SPACE[::7], ids=lambda o: o.id)
@pytest.mark.parametrize("shape, group_size, layout", [
    ((1, 32, 128), None, "projection"),   # one decode token of a 32-head GDN layer
    ((64, 32, 128), None, "contiguous"),  # 2048 rows: the largest count the rule takes
    ((4, 2, 112), None, "projection"),    # a padded partial tile (the table runs the row loop)
    ((5, 256), 64, "contiguous"),         # groups of 64 in one row
], ids=["1x32x128-sliced", "64x32x128", "4x2x112-sliced", "5x256-groups64"])
def test_decode_tile_keeps_the_table_tiles_bits(monkeypatch, shape, group_size, layout,
                                                options, dtypes):
    """Decode-size forwards take a one-warp tile (plan.few_rows_forward_config): y must keep
    the bits of the table's tile, which the rest of this suite holds to the composite."""
    from gatednorm.kernels import config, launch

    inputs = make_inputs(shape, dtypes, options, layout=layout)
    kwargs = options.kwargs(group_size)
    with torch.no_grad():
        decode = gatednorm.rms_norm_gated(inputs.x, inputs.gate, inputs.weight, **kwargs)
        assert [p.meta["num_warps"] for p in launch.cached_plans("fwd")] == [1]
        monkeypatch.setattr(config, "FORWARD_FEW_PROGRAMS", 0)
        launch.clear_cache()
        table = gatednorm.rms_norm_gated(inputs.x, inputs.gate, inputs.weight, **kwargs)
    assert same_bits(decode, table)
