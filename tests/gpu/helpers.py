"""Shared pieces of the GPU suite: the option space, input builders, the three runs of a case
(fused kernel, same-convention composite in the working dtype, fp64 ground truth), ulp and
bit-identity measures, the tolerances and the JSON-lines report.

Nothing here touches CUDA at import time, and the measures work on any device, so the CPU tests
in test_helpers.py check them without a GPU. scripts/run_gpu_suite.sh imports this file as a
plain module (``summarize_report``), so it uses no relative imports.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import gatednorm
from gatednorm import ops, reference

# The CPU suite's tests/conftest.py sets TRITON_INTERPRET=1 unless the environment already has
# it: under the interpreter these tests would check the interpreter, not the compiled kernels.
requires_cuda = pytest.mark.skipif(
    not torch.cuda.is_available() or ops.INTERPRET,
    reason="needs a CUDA device and TRITON_INTERPRET unset or 0 (scripts/run_gpu_suite.sh "
           "exports TRITON_INTERPRET=0)")
# Tests that allocate gigabytes: `--dist loadgroup` runs them one after another on one worker.
heavy = pytest.mark.xdist_group("heavy")

# --------------------------------------------------------------------------------------------
# The option space
# --------------------------------------------------------------------------------------------

ROUNDINGS = reference.ROUNDINGS
ACTIVATIONS = reference.ACTIVATIONS
# (weight, zero_centered): no weight, a weight in x's dtype, an fp32 weight, each zero-centered
# or not (zero-centered needs a weight).
WEIGHT_VARIANTS = (("none", False), ("x", False), ("x", True), ("fp32", False), ("fp32", True))

_SHORT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
          torch.float64: "fp64"}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@dataclass(frozen=True)
class Options:
    """The keyword options of rms_norm_gated that change the kernel's code."""

    rounding: str = "te"
    activation: str = "silu"
    norm_before_gate: bool = True
    weight: str = "x"  # "none", "x" (x's dtype) or "fp32"
    zero_centered: bool = False

    @property
    def id(self) -> str:
        order = "norm_then_gate" if self.norm_before_gate else "gate_then_norm"
        weight = {"none": "no_w", "x": "w", "fp32": "w32"}[self.weight]
        return f"{self.rounding}-{self.activation}-{order}-{weight}" + (
            "_zc" if self.zero_centered else "")

    def kwargs(self, group_size: int | None = None, eps: float = 1e-6) -> dict:
        return dict(eps=eps, zero_centered_gamma=self.zero_centered,
                    activation=self.activation, norm_before_gate=self.norm_before_gate,
                    group_size=group_size, rounding=self.rounding)


@dataclass(frozen=True)
class Dtypes:
    """x's dtype (also y's, dx's and dy's) and the gate's (also dgate's)."""

    x: torch.dtype
    gate: torch.dtype

    @property
    def id(self) -> str:
        if self.gate == self.x:
            return _SHORT[self.x]
        return f"{_SHORT[self.x]}_gate{_SHORT[self.gate]}"


BF16 = Dtypes(torch.bfloat16, torch.bfloat16)
FP16 = Dtypes(torch.float16, torch.float16)
FP32 = Dtypes(torch.float32, torch.float32)
BF16_GATE_FP32 = Dtypes(torch.bfloat16, torch.float32)  # an fp32 gate beside bf16 activations
FP32_GATE_BF16 = Dtypes(torch.float32, torch.bfloat16)  # a bf16 gate beside an fp32 Mamba scan
DTYPES = (BF16, FP16, FP32, BF16_GATE_FP32, FP32_GATE_BF16)

OPTION_SPACE = tuple(
    Options(rounding, activation, norm_before_gate, weight, zero_centered)
    for rounding in ROUNDINGS
    for activation in ACTIVATIONS
    for norm_before_gate in (True, False)
    for weight, zero_centered in WEIGHT_VARIANTS
)


@dataclass(frozen=True)
class Case:
    """One shape and layout through one set of options."""

    name: str
    shape: tuple[int, ...]
    options: Options
    dtypes: Dtypes = BF16
    group_size: int | None = None
    layout: str = "contiguous"  # "contiguous", "projection" (gate sliced) or "permuted"


# Realistic sizes, a representative subset of the options for each.
GDN = (8192, 32, 128)  # tokens x heads x head dim: Gated DeltaNet / Qwen3-Next
FULL_WIDTH = (4096, 5120)  # gate-first over the full width in groups of 1024: Mamba2 / Nemotron-H
REALISTIC_CASES = (
    Case("gdn-te", GDN, Options("te"), layout="projection"),
    Case("gdn-hf-zc", GDN, Options("hf", zero_centered=True), layout="projection"),
    Case("gdn-fp32-gate32", GDN, Options("fp32", weight="fp32"), BF16_GATE_FP32, None,
         "projection"),
    Case("gdn-te-fp16", GDN, Options("te"), FP16, None, "projection"),
    Case("gdn-fp32-dtype", GDN, Options("fp32", activation="sigmoid"), FP32, None, "projection"),
    Case("full-width-te", FULL_WIDTH, Options("te", norm_before_gate=False), BF16, 1024,
         "projection"),
    Case("full-width-hf", FULL_WIDTH, Options("hf", norm_before_gate=False), BF16, 1024,
         "projection"),
    Case("full-width-fp32-w32", FULL_WIDTH,
         Options("fp32", norm_before_gate=False, weight="fp32"), BF16, 1024, "projection"),
    # Mamba2's groups of 640: the forward holds each as a 512 head and a 128 tail tile.
    Case("mamba2-te", FULL_WIDTH, Options("te", norm_before_gate=False), BF16, 640,
         "projection"),
    Case("mamba2-hf-fp16", FULL_WIDTH, Options("hf", norm_before_gate=False), FP16, 640),
    Case("bshd-permuted-te", (4, 2048, 32, 128), Options("te"), layout="permuted"),
    Case("long-row-65536-te", (64, 65536), Options("te")),
    Case("long-row-65536-gate-first-fp32", (64, 65536),
         Options("fp32", norm_before_gate=False, weight="fp32", zero_centered=True)),
)

# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


@dataclass
class Inputs:
    x: torch.Tensor
    gate: torch.Tensor
    weight: torch.Tensor | None
    dy: torch.Tensor

    @property
    def rows(self) -> int:
        return self.x.numel() // self.x.shape[-1]

    def double(self) -> "Inputs":
        return Inputs(self.x.double(), self.gate.double(),
                      None if self.weight is None else self.weight.double(), self.dy.double())


def make_inputs(shape, dtypes: Dtypes, options: Options, *, layout: str = "contiguous",
                x_scale: float = 1.0, device: str = "cuda", host_random: bool = False) -> Inputs:
    """Random x, gate, weight and dy (never zeros).

    layout "projection": the gate is a slice of a wider projection output, as models produce it
    (GDN: ``proj[:, H*D:2*H*D].view(T, H, D)``); "permuted": x and gate are [B, S, H, D] views of
    [B, H, S, D] tensors; "contiguous": plain tensors. host_random draws the numbers on the CPU
    and copies them over (no PyTorch kernel runs on the device: for the sanitizer runs).
    """
    shape = tuple(shape)
    d = shape[-1]
    source = "cpu" if host_random else device

    def randn(*size, dtype, scale=1.0):
        # Drawn in the target dtype and scaled in place: no fp32 temporaries (the 2^31-element
        # test would otherwise need twice its memory).
        t = torch.randn(*size, dtype=dtype, device=source)
        if scale != 1.0:
            t.mul_(scale)
        return t.to(device)

    if layout == "contiguous":
        x = randn(*shape, dtype=dtypes.x, scale=x_scale)
        gate = randn(*shape, dtype=dtypes.gate, scale=2.0)
    elif layout == "projection":
        x = randn(*shape, dtype=dtypes.x, scale=x_scale)
        if len(shape) == 2:
            gate = randn(shape[0], 2 * d, dtype=dtypes.gate, scale=2.0)[:, d:]
        elif len(shape) == 3:
            t, h, _ = shape
            proj = randn(t, 2 * h * d, dtype=dtypes.gate, scale=2.0)
            gate = proj[:, h * d:2 * h * d].view(t, h, d)
        else:
            raise ValueError(f"projection layout takes [T, D] or [T, H, D], got {shape}")
    elif layout == "permuted":
        b, s, h, _ = shape
        x = randn(b, h, s, d, dtype=dtypes.x, scale=x_scale).permute(0, 2, 1, 3)
        gate = randn(b, h, s, d, dtype=dtypes.gate, scale=2.0).permute(0, 2, 1, 3)
    else:
        raise ValueError(f"unknown layout {layout!r}")

    weight = None
    if options.weight != "none":
        weight_dtype = dtypes.x if options.weight == "x" else torch.float32
        center = 0.0 if options.zero_centered else 1.0
        weight = (center + 0.3 * torch.randn(d, device=source)).to(weight_dtype).to(device)
    dy = randn(*shape, dtype=dtypes.x)
    return Inputs(x, gate, weight, dy)


def poison_allocator(nbytes: int, device: str = "cuda") -> None:
    """Fill ``nbytes`` of the caching allocator with 0xFF bytes (NaN in every float dtype) and
    free them, so the outputs allocated next likely start as NaN: an element a kernel leaves
    unwritten then fails every accuracy check. Best effort: the allocator decides reuse."""
    if torch.device(device).type == "cuda":
        torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(0xFF)


GRAD_NAMES = {"x": "dx", "gate": "dgate", "weight": "dweight"}
TENSORS = ("y", "dx", "dgate", "dweight")


def forward_backward(fn, inputs: Inputs, kwargs: dict) -> dict[str, torch.Tensor]:
    """y = fn(x, gate, weight, **kwargs) and its gradients for dy. Leaves keep the inputs'
    strides (detach() is a view), so a sliced gate reaches fn sliced."""
    leaves = {"x": inputs.x.detach().requires_grad_(),
              "gate": inputs.gate.detach().requires_grad_()}
    if inputs.weight is not None:
        leaves["weight"] = inputs.weight.detach().requires_grad_()
    y = fn(leaves["x"], leaves["gate"], leaves.get("weight"), **kwargs)
    grads = torch.autograd.grad(y, list(leaves.values()), inputs.dy)
    out = {"y": y.detach()}
    out.update({GRAD_NAMES[name]: grad for name, grad in zip(leaves, grads)})
    return out


@dataclass
class Runs:
    kernel: dict[str, torch.Tensor]
    composite: dict[str, torch.Tensor]
    exact: dict[str, torch.Tensor]


def run_three(inputs: Inputs, options: Options, group_size: int | None = None,
              eps: float = 1e-6) -> Runs:
    """The fused kernel, the same-convention composite in the working dtype on the same device,
    and the fp64 ground truth (any composite on float64 copies rounds nothing)."""
    kwargs = options.kwargs(group_size, eps)
    outputs_bytes = 2 * (inputs.x.numel() * inputs.x.element_size()
                         + inputs.gate.numel() * inputs.gate.element_size())
    poison_allocator(outputs_bytes, inputs.x.device.type)
    kernel = forward_backward(gatednorm.rms_norm_gated, inputs, kwargs)
    composite = forward_backward(reference.rms_norm_gated, inputs, kwargs)
    exact = forward_backward(reference.rms_norm_gated, inputs.double(),
                             dict(kwargs, rounding="fp32"))
    return Runs(kernel, composite, exact)


# --------------------------------------------------------------------------------------------
# Measures: bit identity and ulp distance
# --------------------------------------------------------------------------------------------

# ulp distance where exactly one side is NaN.
NAN_MISMATCH_ULP = 2**62


def ordered_bits(t: torch.Tensor) -> torch.Tensor:
    """Map bf16 / fp16 / fp32 values to int64 so that consecutive floats are consecutive
    integers (sign-magnitude to two's complement; +0 and -0 both map to 0)."""
    if t.dtype in (torch.bfloat16, torch.float16):
        bits = t.contiguous().view(torch.int16).to(torch.int32)
        magnitude = bits & 0x7FFF
    elif t.dtype == torch.float32:
        bits = t.contiguous().view(torch.int32).to(torch.int64)
        magnitude = bits & 0x7FFFFFFF
    else:
        raise TypeError(f"ordered_bits takes bfloat16, float16 or float32, got {t.dtype}")
    return torch.where(bits < 0, -magnitude, magnitude).to(torch.int64)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise distance in units in the last place of a's dtype (a and b alike): 0 for
    equal values (+0 and -0 too) and for two NaNs, NAN_MISMATCH_ULP where one side is NaN."""
    if a.dtype != b.dtype or a.shape != b.shape:
        raise ValueError(f"ulp_distance needs equal dtypes and shapes, got {a.dtype}{tuple(a.shape)}"
                         f" and {b.dtype}{tuple(b.shape)}")
    distance = (ordered_bits(a) - ordered_bits(b)).abs()
    a_nan, b_nan = torch.isnan(a), torch.isnan(b)
    distance = torch.where(a_nan & b_nan, torch.zeros_like(distance), distance)
    return torch.where(a_nan ^ b_nan, torch.full_like(distance, NAN_MISMATCH_ULP), distance)


def max_ulp(a: torch.Tensor, b: torch.Tensor) -> int:
    return int(ulp_distance(a, b).max().item()) if a.numel() else 0


def fraction_identical(a: torch.Tensor, b: torch.Tensor) -> float:
    """Fraction of elements whose bits are identical (so -0 differs from +0)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        raise ValueError("fraction_identical needs equal dtypes and shapes")
    if a.numel() == 0:
        return 1.0
    int_dtype = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    same = a.contiguous().view(int_dtype) == b.contiguous().view(int_dtype)
    return int(same.sum().item()) / a.numel()


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and fraction_identical(a, b) == 1.0


# --------------------------------------------------------------------------------------------
# Tolerances
# --------------------------------------------------------------------------------------------

# TransformerEngine tests/pytorch/test_numerics.py, test_rmsnorm_accuracy: the output is checked
# with atol {fp32: 1e-7, fp16: 2e-3, bf16: 2e-2} and dtype_tols' rtol; the gradients with atol
# {fp32: 2e-3, fp16: 2e-3, bf16: 2e-2} and rtol {fp32: 1.3e-6, fp16: 1e-3, bf16: 1.6e-2}.
TE_OUTPUT_ATOL = {torch.float32: 1e-7, torch.float16: 2e-3, torch.bfloat16: 2e-2}
TE_GRAD_ATOL = {torch.float32: 2e-3, torch.float16: 2e-3, torch.bfloat16: 2e-2}
TE_RTOL = {torch.float32: 1.3e-6, torch.float16: 1e-3, torch.bfloat16: 1.6e-2}
# TE's gradient tolerances were set on batches of this many tokens (its 126m config, seq 2048).
TE_ROWS = 2048
# Triton's exp, sqrt and division are the fast approximate ones (a few ulp); an fp32 result may
# sit this many fp32 ulps further from fp64 than PyTorch's, which uses the IEEE ones.
FP32_APPROX_ULPS = 8
# dweight sums one term per row, and each term carries the rounding of an intermediate in the
# working dtype (dn in "te", dv and dv * gamma in "hf"): the errors add up as a random walk of
# standard deviation about 0.3 eps * rms(dweight), independently in the kernel and in the
# composite. An element of dweight may therefore be off by this many eps * rms(dweight), whatever
# its own size (seen in the interpreter: an fp16 "hf" dweight element of 1.07 whose column sums
# ~2048 terms of size 1.5 came out 2% off, the composite's 1%, both 3e-4 of the sum's scale).
DWEIGHT_NOISE_EPS = 4


def coarser(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    """The dtype with the larger eps: a tolerance follows the coarsest rounding a value went
    through, the working dtype's or its own (a bf16 dgate beside fp32 x)."""
    return a if torch.finfo(a).eps >= torch.finfo(b).eps else b


def tolerance(tensor: str, working_dtype: torch.dtype, rows: int) -> tuple[float, float]:
    """(atol, rtol) against fp64 for ``tensor`` of a call whose x is ``working_dtype``.

    The working dtype (measure passes the coarser of it and the tensor's own) sets the
    tolerance: an fp32 dgate or dweight computed from bf16-rounded intermediates carries
    bf16-sized errors. rtol is at least two
    ulps (2 * eps): after an intermediate rounding lands on the other side, the kernel may
    sit one more ulp from the composite (TE's bf16 rtol is exactly 2 eps, its fp16 one 1 eps).
    dweight sums over rows: its scale and its fp32 accumulation error grow with sqrt(rows), so
    its atol is TE's scaled by sqrt(rows / TE_ROWS) (QuACK's reasoning).
    """
    atol = (TE_OUTPUT_ATOL if tensor == "y" else TE_GRAD_ATOL)[working_dtype]
    rtol = max(TE_RTOL[working_dtype], 2 * torch.finfo(working_dtype).eps)
    if tensor == "dweight":
        atol *= max(1.0, math.sqrt(rows / TE_ROWS))
    return atol, rtol


def dweight_atol(working_dtype: torch.dtype, rows: int, exact: torch.Tensor) -> float:
    """TE's dweight atol (scaled with sqrt(rows)), or the rounding noise of a sum over rows
    (DWEIGHT_NOISE_EPS eps of the working dtype times the rms of the fp64 dweight), whichever
    is larger."""
    atol, _ = tolerance("dweight", working_dtype, rows)
    finite = exact[torch.isfinite(exact)].double()
    rms = float(finite.pow(2).mean().sqrt().item()) if finite.numel() else 0.0
    return max(atol, DWEIGHT_NOISE_EPS * torch.finfo(working_dtype).eps * rms)


def three_way_slack(tensor: str, working_dtype: torch.dtype, rows: int, scale: float) -> float:
    """Absolute slack of the 3-way rule for a tensor whose largest |fp64| value is ``scale``:
    two eps of the working dtype (the bit-exact rule lets the kernel sit two ulps from the
    composite), the fp32 approximations, and for dweight the sqrt(rows) growth of an fp32 sum."""
    eps32 = torch.finfo(torch.float32).eps
    relative = 2 * torch.finfo(working_dtype).eps + FP32_APPROX_ULPS * eps32
    if tensor == "dweight":
        relative += eps32 * math.sqrt(rows)
    return relative * scale


@dataclass
class Accuracy:
    """How one tensor of the kernel compares with the composite and with fp64."""

    tensor: str
    numel: int
    fraction_identical: float  # kernel vs composite, bitwise
    max_ulp: int  # kernel vs composite
    max_err_kernel: float  # max |kernel - fp64|
    max_err_composite: float  # max |composite - fp64|
    slack: float
    violations: int  # elements outside 2 |composite - fp64| + atol + rtol |fp64|
    worst: str = ""  # the worst violation, for the message

    @property
    def three_way_ok(self) -> bool:
        return self.max_err_kernel <= 2 * self.max_err_composite + self.slack

    @property
    def ok(self) -> bool:
        return self.violations == 0 and self.three_way_ok

    def describe(self) -> str:
        return (f"{self.tensor}: {self.violations}/{self.numel} elements outside tolerance"
                f"{' (' + self.worst + ')' if self.worst else ''}; max|kernel-fp64| "
                f"{self.max_err_kernel:.3e} vs 2*max|composite-fp64| + slack "
                f"{2 * self.max_err_composite + self.slack:.3e}")


def measure(tensor: str, kernel: torch.Tensor, composite: torch.Tensor, exact: torch.Tensor,
            working_dtype: torch.dtype, rows: int) -> Accuracy:
    """Elementwise: |kernel - fp64| <= 2 |composite - fp64| + atol + rtol |fp64| (TE's
    tolerance, widened where the composite, the specification, is itself further off).
    Aggregate (the 3-way rule): max |kernel - fp64| <= 2 max |composite - fp64| + slack."""
    if kernel.shape != exact.shape or composite.shape != exact.shape:
        raise ValueError(f"{tensor}: shapes differ: kernel {tuple(kernel.shape)}, composite "
                         f"{tuple(composite.shape)}, fp64 {tuple(exact.shape)}")
    if kernel.dtype != composite.dtype:
        raise ValueError(f"{tensor}: kernel dtype {kernel.dtype} != composite {composite.dtype}")
    numel = kernel.numel()
    if numel == 0:
        return Accuracy(tensor, 0, 1.0, 0, 0.0, 0.0, 0.0, 0)
    working_dtype = coarser(working_dtype, kernel.dtype)
    atol, rtol = tolerance(tensor, working_dtype, rows)
    exact = exact.double()
    if tensor == "dweight":
        atol = dweight_atol(working_dtype, rows, exact)
    err_kernel = (kernel.double() - exact).abs()
    err_composite = (composite.double() - exact).abs()
    bound = 2 * err_composite + atol + rtol * exact.abs()
    bad = ~(err_kernel <= bound)  # NaN anywhere in the kernel's output is bad
    violations = int(bad.sum().item())
    worst = ""
    if violations:
        excess = torch.where(bad, err_kernel - bound, torch.zeros_like(err_kernel))
        excess = torch.nan_to_num(excess, nan=math.inf)
        flat = int(excess.flatten().argmax().item())
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), kernel.shape))
        worst = (f"at {index}: kernel {kernel.flatten()[flat].item():.6g}, composite "
                 f"{composite.flatten()[flat].item():.6g}, fp64 {exact.flatten()[flat].item():.6g}")
    finite = torch.isfinite(exact)
    scale = float(exact[finite].abs().max().item()) if finite.any() else 0.0
    return Accuracy(
        tensor=tensor,
        numel=numel,
        fraction_identical=fraction_identical(kernel, composite),
        max_ulp=max_ulp(kernel, composite),
        max_err_kernel=float(torch.nan_to_num(err_kernel, nan=math.inf).max().item()),
        max_err_composite=float(torch.nan_to_num(err_composite, nan=math.inf).max().item()),
        slack=three_way_slack(tensor, working_dtype, rows, scale),
        violations=violations,
        worst=worst,
    )


def measure_runs(runs: Runs, working_dtype: torch.dtype, rows: int) -> dict[str, Accuracy]:
    return {name: measure(name, runs.kernel[name], runs.composite[name], runs.exact[name],
                          working_dtype, rows)
            for name in TENSORS if name in runs.kernel}


def assert_accurate(results: dict[str, Accuracy], context: str) -> None:
    failures = [r.describe() for r in results.values() if not r.ok]
    assert not failures, f"{context}:\n  " + "\n  ".join(failures)


# --------------------------------------------------------------------------------------------
# Bit-exactness against the composite
# --------------------------------------------------------------------------------------------

# y and dgate must be bit-identical to the composite in at least this fraction of elements.
MIN_FRACTION_IDENTICAL = 0.999
# and within this many ulps everywhere. With a single rounding at the end ("fp32"), fp32 values
# a few fp32 ulps apart round at most one ulp apart. "te" and "hf" round an intermediate first:
# where it lands one ulp over (about one element in 1e4 for bf16), the final product moves by
# up to two ulps of the output (an ulp of v is 2^-8..2^-7 of v, an ulp of y 2^-8..2^-7 of y).
MAX_ULP = {"fp32": 1, "te": 2, "hf": 2}
# "hf" with the gate after the norm and a weight in x's 16-bit dtype rounds twice before the
# end: the normalized value, then its product with the weight (transformers multiplies two
# bf16 tensors). Each landing one ulp over moves the output further: up to three ulps. GPU
# suite run 12b saw 3 on the zero-centered GDN case; with round-to-nearest-even on the CPU, an
# rstd one or two fp32 ulps off reaches 3 and never 4 in 4M elements (test_helpers.py
# simulates it; three fp32 ulps off can reach 4).
HF_ROUNDED_WEIGHT_PRODUCT_MAX_ULP = 3


def ulp_limit(options: Options) -> int:
    """The largest ulp distance from the composite allowed for y and dgate under ``options``."""
    if options.rounding == "hf" and options.norm_before_gate and options.weight == "x":
        return HF_ROUNDED_WEIGHT_PRODUCT_MAX_ULP
    return MAX_ULP[options.rounding]


def bitexact_tensors(options: Options, dtypes: Dtypes) -> tuple[str, ...]:
    """The outputs held to the bit-exact rule: y and dgate, where they are 16-bit, and dgate
    only with the gate after the norm. Gate-first, dgate = dh * x * act'(gate) carries the
    norm's input gradient dh, a reduction formula the composite computes another way (as for
    dx): where its two terms cancel, fp32 values a few ulps apart are many 16-bit ulps apart."""
    names = []
    if dtypes.x != torch.float32:
        names.append("y")
    if dtypes.gate != torch.float32 and options.norm_before_gate:
        names.append("dgate")
    return tuple(names)


def bitexact_failures(results: dict[str, Accuracy], options: Options,
                      dtypes: Dtypes) -> list[str]:
    failures = []
    for name in bitexact_tensors(options, dtypes):
        r = results[name]
        if r.fraction_identical < MIN_FRACTION_IDENTICAL:
            failures.append(f"{name}: {r.fraction_identical:.6f} of elements bit-identical to the "
                            f"composite, want >= {MIN_FRACTION_IDENTICAL}")
        if r.max_ulp > ulp_limit(options):
            failures.append(f"{name}: {r.max_ulp} ulp from the composite, want <= "
                            f"{ulp_limit(options)}")
    return failures


# --------------------------------------------------------------------------------------------
# The JSON-lines report
# --------------------------------------------------------------------------------------------

REPORT_NAME = "gpu-report.jsonl"


def results_dir() -> Path:
    """$OUT when set (the device machine's returned folder), else ./gpu-results."""
    return Path(os.environ.get("OUT") or "gpu-results")


@dataclass
class Report:
    """Appends one JSON object per line. Each record is one write() of one line, so records
    from several pytest-xdist workers appending to the same file do not interleave."""

    path: Path

    def add(self, **record) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(record, sort_keys=True, default=str) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)


def accuracy_records(kind: str, test: str, case: Case, results: dict[str, Accuracy],
                     inputs: Inputs) -> list[dict]:
    """One record per tensor: the case's options and dtypes, and the measures."""
    records = []
    asserted = bitexact_tensors(case.options, case.dtypes) if kind == "bitexact" else ()
    for name, r in results.items():
        records.append(dict(
            kind=kind, test=test, case=case.name, shape=list(case.shape),
            group_size=case.group_size, layout=case.layout,
            rounding=case.options.rounding, activation=case.options.activation,
            norm_before_gate=case.options.norm_before_gate,
            weight=None if inputs.weight is None else dtype_name(inputs.weight.dtype),
            zero_centered=case.options.zero_centered,
            x_dtype=dtype_name(case.dtypes.x), gate_dtype=dtype_name(case.dtypes.gate),
            tensor=name, numel=r.numel, fraction_identical=r.fraction_identical,
            max_ulp=r.max_ulp, bitexact_asserted=name in asserted,
            ulp_limit=ulp_limit(case.options) if name in asserted else None,
            max_err_kernel=r.max_err_kernel, max_err_composite=r.max_err_composite,
            violations=r.violations,
        ))
    return records


def summarize_report(path: str | Path) -> str:
    """A table of the bit-exact records: per (rounding, dtypes, tensor), the configurations
    measured, the lowest fraction bit-identical to the composite and the largest ulp distance."""
    path = Path(path)
    if not path.exists():
        return f"no report at {path}"
    groups: dict[tuple, list[dict]] = defaultdict(list)
    with open(path, encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            if record.get("kind") != "bitexact":
                continue
            key = (record["rounding"], record["x_dtype"], record["gate_dtype"], record["tensor"])
            groups[key].append(record)
    if not groups:
        return f"no bit-exact records in {path}"
    header = (f"{'rounding':8} {'x':9} {'gate':9} {'tensor':8} {'configs':>7} "
              f"{'min identical':>13} {'max ulp':>7} {'asserted':>8}")
    lines = [header, "-" * len(header)]
    tensor_order = {name: i for i, name in enumerate(TENSORS)}
    for key in sorted(groups, key=lambda k: (k[0], k[1], k[2], tensor_order.get(k[3], 9))):
        records = groups[key]
        asserted = sum(r["bitexact_asserted"] for r in records)
        lines.append(f"{key[0]:8} {key[1]:9} {key[2]:9} {key[3]:8} {len(records):7d} "
                     f"{min(r['fraction_identical'] for r in records):13.6f} "
                     f"{max(r['max_ulp'] for r in records):7d} {asserted:8d}")
    return "\n".join(lines)
