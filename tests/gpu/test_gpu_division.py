"""The FP8 kernels' division by a block scale against the hardware's correctly rounded one.

The quantizing kernels divide y by its block's fp32 scale with a reciprocal hoisted out of the
elements and one residual correction (gatednorm.quantize.kernels.divide), not with div.rn
per element. Here both run on the same operands: every bf16 and every fp16 value, against
scales of maxima spread over the whole fp32 range, and random fp32 quotients up to 449."""

import pytest
import torch
import triton
import triton.language as tl

from gatednorm.quantize.kernels import divide, division_factors, fp8_codes

from .helpers import requires_cuda

pytestmark = [requires_cuda, pytest.mark.timeout(300)]

BLOCK = 1024
# Below this a quotient rounds to a zero code whatever its last bits (2**-10 is half the
# smallest E4M3 subnormal, 2**-9).
SMALLEST_CODED = 2.0 ** -11


@triton.jit
def _divide_kernel(Y, SCALE, FAST, EXACT, FAST_CODES, EXACT_CODES, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    y = tl.load(Y + i, mask=mask)
    scale = tl.load(SCALE + i, mask=mask, other=1.0)
    divisor, negative_inverse, negative_prescale = division_factors(scale)
    fast = divide(y, divisor, negative_inverse, negative_prescale)
    exact = tl.math.div_rn(y, scale)
    # The spec's codes of the exact quotient: saturate, round to nearest even, NaN -> 0x7F.
    saturated = tl.minimum(tl.maximum(exact, -448.0), 448.0)
    exact_codes = tl.where(exact != exact, 0x7F,
                           saturated.to(tl.float8e4nv).to(tl.uint8, bitcast=True))
    tl.store(FAST + i, fast, mask=mask)
    tl.store(EXACT + i, exact, mask=mask)
    tl.store(FAST_CODES + i, fp8_codes(fast), mask=mask)
    tl.store(EXACT_CODES + i, exact_codes, mask=mask)


def divide_both_ways(y, scale):
    n = y.numel()
    quotients = [torch.full_like(y, 7.0) for _ in range(2)]
    codes = [torch.full_like(y, 0x55, dtype=torch.uint8) for _ in range(2)]
    _divide_kernel[(triton.cdiv(n, BLOCK),)](y, scale, *quotients, *codes, n, BLOCK=BLOCK)
    return (*quotients, *codes)


def every_value(dtype):
    return torch.arange(-32768, 32768, dtype=torch.int32, device="cuda").to(torch.int16).view(
        dtype).float()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_every_16_bit_value_divides_as_div_rn_over_the_fp32_range(dtype):
    y = every_value(dtype)
    generator = torch.Generator(device="cuda").manual_seed(0)
    exponents = torch.empty(400, device="cuda").uniform_(-140, 120, generator=generator)
    maxima = 2.0 ** exponents * (1 + torch.rand(400, device="cuda", generator=generator))
    for amax in maxima:
        scale = (amax / torch.tensor(448.0, device="cuda")).expand_as(y).contiguous()
        fast, exact, fast_codes, exact_codes = divide_both_ways(y, scale)
        coded = (exact.abs() >= SMALLEST_CODED) & (exact.abs() <= 2.0 ** 40)
        assert torch.equal(fast[coded], exact[coded]), f"amax {amax.item()!r}"
        in_block = (y.abs() <= amax) | y.isnan()  # the values a block with this amax holds
        assert torch.equal(fast_codes[in_block], exact_codes[in_block]), f"amax {amax.item()!r}"


def test_random_fp32_quotients_divide_as_div_rn():
    generator = torch.Generator(device="cuda").manual_seed(1)
    n = 1 << 22
    for _ in range(20):
        # Scales up to 2**111, so that y (to 449 scales) stays finite: an infinite y belongs
        # to a block whose scale is 1 (the case below).
        scale = (2.0 ** torch.empty(n, device="cuda").uniform_(-130, 110, generator=generator)
                 * (1 + torch.rand(n, device="cuda", generator=generator)))
        y = (torch.rand(n, device="cuda", generator=generator) * 2 - 1) * 449 * scale
        fast, exact, fast_codes, exact_codes = divide_both_ways(y, scale)
        coded = exact.abs() >= SMALLEST_CODED
        assert torch.equal(fast[coded], exact[coded])
        assert torch.equal(fast_codes, exact_codes)


@pytest.mark.parametrize("scale", [1.0, 3.0, 1e30, 2.0 ** -70, 2.0 ** -130])
def test_zeros_infinities_nan_and_subnormals_give_the_spec_codes(scale):
    values = [0.0, float("nan"), 1e-40, 1e-45]
    if scale >= 1:  # a block holding them has a scale of at least 1
        values += [float("inf"), 3e38]
    y = torch.tensor(values)
    y = torch.cat([y, -y])  # -0.0
    # A NaN with its sign bit set, written as bits (negating a NaN on the GPU gives the
    # canonical, positive NaN).
    y.view(torch.int32)[len(values) + 1] = -0x400000
    y = y.cuda()
    assert y[len(values) + 1].isnan() and y[len(values) + 1].view(torch.int32) < 0
    _, _, fast_codes, exact_codes = divide_both_ways(y, torch.full_like(y, scale))
    assert fast_codes.tolist() == exact_codes.tolist()
    assert fast_codes[1] == fast_codes[len(values) + 1] == 0x7F
    assert fast_codes[len(values)] == 0x80  # -0.0 keeps its sign
