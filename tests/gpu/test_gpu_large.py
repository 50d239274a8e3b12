"""A tensor over 2^31 elements: (2^24 + 3) rows x 128 in bf16, forward and backward.

Every offset past element 2^31 needs int64 arithmetic in the kernels. x, y, dy, dx and dgate are
4 GiB each and the gate is a slice of an 8 GiB projection (about 30 GiB in all, plus 8 GiB for
the fp64 dweight reference), so this test runs alone on its worker (the "heavy" group).
Sampled rows (the first, those around element 2^31, the last, and random ones) are compared
with the composite and with fp64 computed on just those rows; dweight, a sum over all rows, with
an fp64 sum computed chunk by chunk.
"""

import pytest
import torch

import gatednorm
from gatednorm import reference

from .helpers import (
    BF16,
    Inputs,
    Options,
    bitexact_failures,
    dweight_atol,
    forward_backward,
    heavy,
    make_inputs,
    measure,
    poison_allocator,
    requires_cuda,
    tolerance,
)

pytestmark = [requires_cuda, heavy, pytest.mark.timeout(240)]

D = 128
ROWS = 2**24 + 3
GiB = 2**30
# x, the projection (2x), dy, the NaN-filled memory y, dx and dgate are carved from (4x), and
# the fp64 reference of one chunk.
NEEDED_BYTES = 8 * ROWS * D * 2 + 8 * GiB
REFERENCE_CHUNK_ROWS = 2**20


def fp64_dweight(inputs: Inputs, kwargs: dict) -> torch.Tensor:
    """dweight in fp64, summed over chunks of rows so that the fp64 graph stays small."""
    total = torch.zeros(D, dtype=torch.float64, device=inputs.x.device)
    for start in range(0, ROWS, REFERENCE_CHUNK_ROWS):
        rows = slice(start, min(start + REFERENCE_CHUNK_ROWS, ROWS))
        chunk = Inputs(inputs.x[rows], inputs.gate[rows], inputs.weight, inputs.dy[rows])
        total += forward_backward(reference.rms_norm_gated, chunk.double(),
                                  dict(kwargs, rounding="fp32"))["dweight"]
    return total


def test_over_2_31_elements_forward_backward():
    free, _ = torch.cuda.mem_get_info()
    if free < NEEDED_BYTES:
        pytest.skip(f"needs {NEEDED_BYTES / GiB:.0f} GiB free on the GPU, has {free / GiB:.0f}")
    options = Options("te")
    kwargs = options.kwargs()
    inputs = make_inputs((ROWS, D), BF16, options, layout="projection")
    assert inputs.x.numel() > 2**31 and inputs.gate.stride(0) == 2 * D

    # y, dx and dgate land in NaN-filled memory: a row the kernels never reach stays NaN.
    poison_allocator(4 * ROWS * D * 2)
    kernel = forward_backward(gatednorm.rms_norm_gated, inputs, kwargs)
    for name in ("y", "dx", "dgate"):
        assert not torch.isnan(kernel[name]).any(), f"{name} has unwritten (NaN) elements"

    around_2_31 = [2**24 - 2, 2**24 - 1, 2**24, 2**24 + 1]
    picked = {0, 1, 2**23, *around_2_31, ROWS - 2, ROWS - 1}
    picked |= set(torch.randint(0, ROWS, (55,)).tolist())
    rows = torch.tensor(sorted(picked), device=inputs.x.device)
    sample = Inputs(inputs.x[rows], inputs.gate[rows], inputs.weight, inputs.dy[rows])
    composite = forward_backward(reference.rms_norm_gated, sample, kwargs)
    exact = forward_backward(reference.rms_norm_gated, sample.double(),
                             dict(kwargs, rounding="fp32"))
    results = {name: measure(name, kernel[name][rows], composite[name], exact[name],
                             torch.bfloat16, len(rows))
               for name in ("y", "dx", "dgate")}
    failures = bitexact_failures(results, options, BF16)
    failures += [r.describe() for r in results.values() if not r.ok]
    assert not failures, "sampled rows:\n  " + "\n  ".join(failures)

    # dweight: the tolerance against fp64 only (no working-dtype composite of a 2^31-element sum).
    want = fp64_dweight(inputs, kwargs)
    got = kernel["dweight"].double()
    _, rtol = tolerance("dweight", torch.bfloat16, ROWS)
    atol = dweight_atol(torch.bfloat16, ROWS, want)
    excess = (got - want).abs() - (atol + rtol * want.abs())
    assert not (excess > 0).any() and torch.isfinite(got).all(), (
        f"dweight: {int((excess > 0).sum())} of {D} outside atol {atol:.3g} + rtol {rtol:.3g}; "
        f"worst excess {excess.max().item():.3g}")
