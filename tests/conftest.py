"""Shared helpers of the CPU suite: the Triton kernels run on CPU tensors through the interpreter.

TRITON_INTERPRET must be set before triton (and so gatednorm) is imported, hence the first line.
A run that exports TRITON_INTERPRET=0 (a GPU run) keeps its value; the CPU kernel tests then skip
with a reason instead of comparing the eager reference with itself.
"""

import os
import subprocess
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import contextlib  # noqa: E402
import math  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_map  # noqa: E402

import gatednorm  # noqa: E402
from gatednorm import ops, reference  # noqa: E402
from gatednorm.kernels import launch  # noqa: E402

from gatednorm.kernels import config as _config  # noqa: E402

# The shipped threshold, read before any fixture changes it.
DECODE_FEW_PROGRAMS = _config.FORWARD_FEW_PROGRAMS
ROUNDINGS = reference.ROUNDINGS
ACTIVATIONS = reference.ACTIVATIONS
LOW_PRECISION = (torch.bfloat16, torch.float16)


def pytest_configure(config):
    # Triton 3.6's interpreter reads one-element arrays as Python ints (loop bounds, scalar
    # loads) through a NumPy call deprecated in NumPy 1.25; not ours to fix, and thousands of lines.
    config.addinivalue_line(
        "filterwarnings",
        "ignore:Conversion of an array with ndim > 0 to a scalar is deprecated:DeprecationWarning")
    # With eps = 0 the interpreter evaluates 1 / sqrt(0) on the masked padding lanes of a tile
    # (NumPy warns where a GPU stays silent); those lanes are never stored. exp2 of a large
    # -gate overflows to inf by design (the activation then saturates to 0).
    for message in ("divide by zero encountered", "invalid value encountered",
                    "overflow encountered in exp2"):
        config.addinivalue_line(
            "filterwarnings", f"ignore:{message}:RuntimeWarning:triton.runtime.interpreter")


# The GPU suite's test modules need a CUDA device and compiled kernels: without them they are
# not collected at all (rather than collected and skipped by the thousand), so that the
# summary's counts are the CPU suite's. tests/gpu/test_helpers.py checks the GPU suite's
# helpers on CPU tensors and always runs.
GPU_SUITE_RUNS = torch.cuda.is_available() and os.environ["TRITON_INTERPRET"] != "1"
collect_ignore_glob = [] if GPU_SUITE_RUNS else ["gpu/test_gpu_*.py"]


def _suite_notes(config) -> list[str]:
    notes = []
    if not GPU_SUITE_RUNS:
        notes.append("tests/gpu/test_gpu_*.py not collected: no CUDA device or "
                     "TRITON_INTERPRET=1 (GPU suite: run scripts/run_gpu_suite.sh on a GPU)")
    if config.getoption("markexpr") == "not slow":
        notes.append("slow tests deselected (long-row and many-row interpreter cases): "
                     "run them with -m slow")
    return notes


def pytest_report_header(config):
    import triton

    return [f"gatednorm CPU suite: TRITON_INTERPRET={os.environ['TRITON_INTERPRET']}, "
            f"torch {torch.__version__}, triton {triton.__version__}", *_suite_notes(config)]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    # -q hides the header: say it again at the end, where the counts are.
    for note in _suite_notes(config):
        terminalreporter.write_line(note)


@pytest.fixture(autouse=True)
def _seed():
    # Every test starts from the same generator state, whatever ran before it on this worker.
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _table_tiles(monkeypatch):
    """Tests run the launch table's tiles: the small shapes they use would otherwise all take
    the decode tile (plan.few_rows_forward_config), and the table's multi-row tiles, row
    masks and row loop would go untested. Tests of the decode tile ask for ``decode_tile``."""
    monkeypatch.setattr(_config, "FORWARD_FEW_PROGRAMS", 0)


@pytest.fixture
def decode_tile(monkeypatch):
    """The shipped decode-tile rule on; launch plans built under it are dropped after."""
    from gatednorm.kernels import launch

    monkeypatch.setattr(_config, "FORWARD_FEW_PROGRAMS", DECODE_FEW_PROGRAMS)
    launch.clear_cache()
    yield
    launch.clear_cache()


@pytest.fixture
def reference_path(monkeypatch):
    """CPU tensors run the eager reference composite (what a CPU user gets without
    TRITON_INTERPRET), also in a run that set TRITON_INTERPRET=1 for the kernel tests. The
    host path's cache is emptied before and after: a call checked or launched under the
    interpreter would otherwise keep running the kernels, and the other way round."""
    monkeypatch.setattr(ops, "INTERPRET", False)
    launch.clear_cache()
    yield
    launch.clear_cache()


@pytest.fixture
def interpreter():
    """Tests that run the Triton kernels on CPU tensors need the interpreter."""
    if not ops.INTERPRET:
        pytest.skip("CPU kernel tests need TRITON_INTERPRET=1; this run set "
                    f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')!r}")


def dtype_id(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
            torch.float64: "fp64"}[dtype]


# ---------------------------------------------------------------------------------------------
# NaN poisoning. The library allocates its own outputs with torch.empty and torch.empty_like;
# on CPU a fresh allocation is usually zero pages or a recycled block, neither of which reliably
# looks wrong. Patching both for the duration of a call makes every allocation the launchers
# make (y, rstd, dx, dgate, dweight and the dweight partials) start as NaN, so an element a
# kernel forgets to write cannot match a finite reference.


def _nan_empty(real_empty):
    def empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        if t.is_floating_point() and t.device.type != "meta":
            t.fill_(float("nan"))
        return t

    return empty


@contextlib.contextmanager
def nan_poisoned_empty():
    real_empty, real_empty_like = torch.empty, torch.empty_like
    torch.empty, torch.empty_like = _nan_empty(real_empty), _nan_empty(real_empty_like)
    try:
        yield
    finally:
        torch.empty, torch.empty_like = real_empty, real_empty_like


# ---------------------------------------------------------------------------------------------
# The interpreter's bf16 rounding. Triton 3.6's interpreter converts fp32 to bf16 by dropping
# the low 16 bits (truncation toward zero) where a GPU rounds to nearest even; fp16 is rounded
# exactly. To compare the kernels with the same-convention composite at the bit level on CPU,
# the composite is run with every bf16 rounding done the interpreter's way. Only three ops
# produce computed bf16 values in the composites and their autograd graphs; any other op that
# does raises, so the emulation cannot silently diverge from what it claims.

_aten = torch.ops.aten


def truncate_to_bf16(t: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 by truncation, as the Triton interpreter converts (exact for normal numbers)."""
    return (t.float().view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)


class InterpreterBF16Rounding(TorchDispatchMode):
    """Runs eager PyTorch with bf16 results rounded by truncation (fp32 math, then truncate)."""

    RECOMPUTED = {_aten._to_copy.default, _aten.mul.Tensor, _aten.sum.dim_IntList}
    UNCHANGED = {_aten.view.default, _aten.detach.default, _aten._unsafe_view.default,
                 _aten.alias.default, _aten.t.default, _aten.expand.default,
                 _aten.clone.default, _aten.empty_like.default, _aten.ones_like.default,
                 _aten.zeros_like.default}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16:
            return out
        if func in self.UNCHANGED:
            return out
        if func not in self.RECOMPUTED:
            raise NotImplementedError(f"InterpreterBF16Rounding does not emulate {func}")

        def upcast(a):
            return a.float() if isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 else a

        fp32_args = tree_map(upcast, args)
        fp32_kwargs = dict(tree_map(upcast, kwargs))
        if fp32_kwargs.get("dtype") == torch.bfloat16:
            fp32_kwargs["dtype"] = torch.float32
        return truncate_to_bf16(func(*fp32_args, **fp32_kwargs))


def working_dtype_rounding(*dtypes: torch.dtype):
    """The context in which eager PyTorch on tensors of these dtypes rounds the way the kernels
    do on this machine."""
    if torch.bfloat16 in dtypes and ops.INTERPRET:
        return InterpreterBF16Rounding()
    return contextlib.nullcontext()


# ---------------------------------------------------------------------------------------------
# Running a forward and backward and comparing results.


@dataclass
class Result:
    """y and the gradients of x, gate and weight (dweight None without a weight)."""

    y: torch.Tensor
    dx: torch.Tensor
    dgate: torch.Tensor
    dweight: torch.Tensor | None

    def named(self):
        pairs = [("y", self.y), ("dx", self.dx), ("dgate", self.dgate)]
        if self.dweight is not None:
            pairs.append(("dweight", self.dweight))
        return pairs


def forward_backward(fn, x, gate, weight, dy, **options) -> Result:
    """y = fn(x, gate, weight, **options), then y.backward(dy), on fresh leaves."""
    x = x.detach().clone().requires_grad_()
    gate = gate.detach().clone().requires_grad_()
    if weight is not None:
        weight = weight.detach().clone().requires_grad_()
    y = fn(x, gate, weight, **options)
    y.backward(dy)
    return Result(y.detach(), x.grad, gate.grad, None if weight is None else weight.grad)


def fused(x, gate, weight, dy, **options) -> Result:
    """gatednorm.rms_norm_gated forward and backward, every output allocation NaN-poisoned."""
    with nan_poisoned_empty():
        return forward_backward(gatednorm.rms_norm_gated, x, gate, weight, dy, **options)


def fused_on_views(x, gate, weight, dy, **options) -> Result:
    """Like ``fused``, on x, gate and weight exactly as laid out: ``fused`` clones its inputs,
    which makes a sliced or permuted view contiguous; detach keeps the strides and the
    storage offset."""
    leaves = [None if t is None else t.detach().requires_grad_() for t in (x, gate, weight)]
    with nan_poisoned_empty():
        y = gatednorm.rms_norm_gated(*leaves, **options)
        grads = torch.autograd.grad(y, [t for t in leaves if t is not None], dy)
    return Result(y.detach(), grads[0], grads[1], grads[2] if weight is not None else None)


def composite(x, gate, weight, dy, **options) -> Result:
    """The same-convention eager composite, in the inputs' dtypes, rounding as the kernels do."""
    dtypes = [t.dtype for t in (x, gate, weight) if t is not None]
    with working_dtype_rounding(*dtypes):
        return forward_backward(reference.rms_norm_gated, x, gate, weight, dy, **options)


def fp64_truth(x, gate, weight, dy, **options) -> Result:
    """The composite on float64 copies: every rounding is the identity."""
    return forward_backward(reference.rms_norm_gated, x.double(), gate.double(),
                            None if weight is None else weight.double(), dy.double(), **options)


def max_error(actual: torch.Tensor, truth: torch.Tensor) -> float:
    return (actual.double() - truth).abs().max().item() if truth.numel() else 0.0


def assert_finite(result: Result) -> None:
    for name, t in result.named():
        assert torch.isfinite(t).all(), f"{name} has non-finite elements (unwritten output?)"


def assert_three_way(kernel: Result, eager: Result, truth: Result, rows: int) -> None:
    """The kernel's error against fp64 is at most twice the eager composite's, plus slack.

    The composite in the working dtype is what a user runs today; the fused op may not be less
    accurate than it beyond a factor 2 (flash-attention's rule). The slack, one unit of the output
    dtype at the top of the reference's range, absorbs the cases where the composite happens to
    round its largest elements exactly. dweight sums a product over every row in fp32, in an
    order of the kernel's own: its slack also grows with sqrt(rows).
    """
    for (name, k), (_, e), (_, t) in zip(kernel.named(), eager.named(), truth.named()):
        assert k.dtype == e.dtype, f"{name}: dtype {k.dtype}, composite gives {e.dtype}"
        assert k.shape == t.shape, f"{name}: shape {tuple(k.shape)}, expected {tuple(t.shape)}"
        scale = t.abs().max().item() if t.numel() else 0.0
        slack = torch.finfo(k.dtype).eps * scale
        if name == "dweight":
            slack += torch.finfo(torch.float32).eps * math.sqrt(max(rows, 1)) * scale
        kernel_error, eager_error = max_error(k, t), max_error(e, t)
        assert kernel_error <= 2 * eager_error + slack, (
            f"{name}: kernel error {kernel_error:.3e} vs fp64, composite error {eager_error:.3e}, "
            f"allowed {2 * eager_error + slack:.3e}")


def assert_matches_composite(kernel: Result, eager: Result, working_dtype: torch.dtype,
                             min_identical: float = 0.99) -> None:
    """y, dx and dgate agree with the same-dtype composite (rounded as the kernels round).

    The kernels round at the composite's rounding points, so a 16-bit output is the same bits
    except where the fp32 values before a rounding differ in their last bits (reduction order,
    the association of a product) and land on either side of a rounding boundary: at least
    ``min_identical`` of the elements are identical. Every element is within one unit of its
    own dtype (a flipped final rounding) plus four units of the working dtype at the top of the
    range (a flipped rounding of a working-dtype intermediate, or for fp32 the few ulps by
    which two fp32 evaluations of the same formula differ).
    dweight is left to the fp64 comparison: its summation order is the kernel's own.
    """
    for (name, k), (_, e) in list(zip(kernel.named(), eager.named()))[:3]:
        assert k.dtype == e.dtype, f"{name}: dtype {k.dtype}, composite gives {e.dtype}"
        if k.numel() == 0:
            continue
        if k.dtype in LOW_PRECISION:
            identical = (k == e).double().mean().item()
            assert identical >= min_identical, (
                f"{name}: only {identical:.2%} of the elements equal the composite's")
        expected = e.double()
        allowed = (4 * torch.finfo(working_dtype).eps * expected.abs().max()
                   + torch.finfo(k.dtype).eps * expected.abs())
        excess = ((k.double() - expected).abs() - allowed).max().item()
        assert excess <= 0, f"{name}: differs from the composite by {excess:.3e} beyond the allowance"


def make_inputs(shape, dtype, *, gate_dtype=None, weight_dtype=None, has_weight=True,
                zero_centered_gamma=False, scale=1.0):
    """Random x, gate, weight and dy; never zeros. Weights sit near their trained regime."""
    d = shape[-1]
    x = (torch.randn(shape) * scale).to(dtype)
    gate = (torch.randn(shape) * 2).to(gate_dtype or dtype)
    weight = None
    if has_weight:
        centre = 0.0 if zero_centered_gamma else 1.0
        weight = (centre + 0.2 * torch.randn(d)).to(weight_dtype or dtype)
    dy = torch.randn(shape).to(dtype)
    return x, gate, weight, dy


def rows_of(shape) -> int:
    return math.prod(shape[:-1])


def run_interpreted(source: str, timeout_s: int = 300) -> str:
    """Run ``source`` in a fresh Python with TRITON_INTERPRET=1 (for tests whose process has
    already imported the kernels another way); asserts it exits 0 and returns its stdout."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run([sys.executable, "-c", source], env=env, capture_output=True,
                            text=True, timeout=timeout_s)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout
