"""Compilation: new row counts reuse the compiled Triton kernels; torch.compile (fullgraph,
dynamic row counts, mode="reduce-overhead" training) and manual CUDA graph capture agree with
eager; the registered ops pass torch.library.opcheck on CUDA."""

import copy

import pytest
import torch
from torch import nn

import gatednorm
from gatednorm.kernels.backward import backward_tile_kernel, dweight_reduce_kernel
from gatednorm.kernels.forward import forward_long_row_kernel, forward_tile_kernel

from .helpers import (
    BF16,
    Case,
    Inputs,
    Options,
    forward_backward,
    make_inputs,
    max_ulp,
    requires_cuda,
    same_bits,
    tolerance,
    ulp_limit,
)

pytestmark = [requires_cuda, pytest.mark.timeout(240)]

# --------------------------------------------------------------------------------------------
# Triton: 100 row counts, one compile
# --------------------------------------------------------------------------------------------

KERNELS = (forward_tile_kernel, forward_long_row_kernel, backward_tile_kernel,
           dweight_reduce_kernel)

ROW_COUNTS = tuple(range(1, 65)) + (
    97, 100, 127, 128, 129, 199, 255, 256, 257, 383, 500, 511, 512, 513, 777, 1000, 1023, 1024,
    1025, 1500, 2047, 2048, 2049, 3000, 4095, 4096, 4097, 5000, 6001, 7777, 8191, 8192, 8193,
    10007, 12345, 16384)
assert len(set(ROW_COUNTS)) == 100


def compiled_variants() -> dict[str, int]:
    """How many variants of each kernel Triton holds compiled, over all devices: in triton 3.6
    ``JITFunction.device_caches[device][0]`` maps each specialization key to its kernel."""
    return {kernel.__name__: sum(len(caches[0]) for caches in kernel.device_caches.values())
            for kernel in KERNELS}


@pytest.mark.parametrize("shape_of,options,layout", (
    pytest.param(lambda rows: (rows, 128), Options("te"), "contiguous", id="tile-d128"),
    pytest.param(lambda rows: (rows, 4, 128), Options("hf", norm_before_gate=False),
                 "projection", id="tile-gdn-sliced-gate"),
    pytest.param(lambda rows: (rows, 5000), Options("fp32", weight="fp32"), "contiguous",
                 id="one-row-tiles-d5000"),
    pytest.param(lambda rows: (rows, 20000), Options("te", activation="sigmoid"), "contiguous",
                 id="long-row-d20000"),
))
def test_new_row_counts_do_not_recompile(shape_of, options, layout):
    """Row count, strides and eps are runtime arguments: after the first call, 99 more row
    counts through one (D, dtype, options) compile nothing, training or inference.

    The first call takes the largest row count: its dweight reduction runs in two levels, the
    first writing fp32, so it compiles both variants of dweight_reduce_kernel that any row
    count uses. [T, H, D] with a sliced gate also calls T = 1 first: one token merges into one
    leading dim where more need two, a different constexpr (one more variant, once)."""
    kwargs = options.kwargs()

    def call(rows):
        inputs = make_inputs(shape_of(rows), BF16, options, layout=layout)
        out = forward_backward(gatednorm.rms_norm_gated, inputs, kwargs)
        with torch.no_grad():
            inference = gatednorm.rms_norm_gated(inputs.x, inputs.gate, inputs.weight, **kwargs)
        assert same_bits(inference, out["y"])

    first_calls = (max(ROW_COUNTS),) + ((1,) if layout == "projection" else ())
    for rows in first_calls:
        call(rows)
    after_first = compiled_variants()
    for rows in sorted(set(ROW_COUNTS) - set(first_calls)):
        call(rows)
        now = compiled_variants()
        assert now == after_first, f"rows={rows} compiled new variants: {after_first} -> {now}"


# --------------------------------------------------------------------------------------------
# torch.compile
# --------------------------------------------------------------------------------------------


def closed_over(kwargs: dict):
    """rms_norm_gated with its options fixed, taking only tensors (as a model calls it)."""
    def fn(x, gate, weight):
        return gatednorm.rms_norm_gated(x, gate, weight, **kwargs)
    return fn


def assert_matches_eager(got: dict, want: dict, case: Case, rows: int) -> None:
    """y and (gate after the norm) dgate within the bit-exact ulp limit of eager; dx and
    dweight within TE's tolerance of it (Inductor may launch the same kernels with other
    alignment hints, which can change an fp32 reduction's order)."""
    for name, expected in want.items():
        actual = got[name]
        assert actual.shape == expected.shape and actual.dtype == expected.dtype, name
        if name == "y" or (name == "dgate" and case.options.norm_before_gate):
            ulps = max_ulp(actual, expected)
            assert ulps <= ulp_limit(case.options), f"{name}: {ulps} ulp from eager"
        else:
            atol, rtol = tolerance(name, case.dtypes.x, rows)
            torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, msg=name)


COMPILE_CASES = (
    Case("gdn-sliced-gate", (256, 8, 128), Options("te"), layout="projection"),
    Case("gate-first-groups-w32", (64, 2048),
         Options("hf", norm_before_gate=False, weight="fp32", zero_centered=True), BF16, 512),
    Case("long-row-20000", (4, 20000), Options("fp32", activation="sigmoid")),
)


@pytest.mark.parametrize("case", COMPILE_CASES, ids=lambda c: c.name)
def test_fullgraph_matches_eager(case):
    torch._dynamo.reset()
    kwargs = case.options.kwargs(case.group_size)
    compiled = torch.compile(closed_over(kwargs), fullgraph=True)
    inputs = make_inputs(case.shape, case.dtypes, case.options, layout=case.layout)
    got = forward_backward(compiled, inputs, {})
    want = forward_backward(gatednorm.rms_norm_gated, inputs, kwargs)
    assert_matches_eager(got, want, case, inputs.rows)


def test_compiled_new_row_counts_do_not_recompile():
    """After the first two row counts (static, then automatically dynamic), new row counts run
    the same compiled graph: set_stance("fail_on_recompile") raises on any recompile.

    Dynamo traces into the launchers, so any shape-dependent Python there would become a
    guard. The launchers avoid that: the dweight reduction is always two launches, the chunk
    size uses torch.sym_max, and the partial buffers are flat (a [1, d] buffer would guard on
    its leading size being 1). The first GPU run caught exactly that guard at rows <= 16."""
    torch._dynamo.reset()
    case = Case("dynamic-rows", (4099, 128), Options("te"))
    kwargs = case.options.kwargs()
    compiled = torch.compile(closed_over(kwargs), fullgraph=True)

    def step(rows):
        inputs = make_inputs((rows, 128), BF16, case.options)
        got = forward_backward(compiled, inputs, {})
        want = forward_backward(gatednorm.rms_norm_gated, inputs, kwargs)
        assert_matches_eager(got, want, case, rows)

    step(16)
    step(24)
    with torch.compiler.set_stance("fail_on_recompile"):
        for rows in (2, 3, 5, 17, 100, 257, 1000, 2047, 4099, 20000):
            step(rows)


class GatedBlock(nn.Module):
    """proj -> (x, gate) slices -> RMSNormGated per head -> out: the GDN output path."""

    def __init__(self, hidden: int, heads: int, head_dim: int):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.proj = nn.Linear(hidden, 2 * heads * head_dim)
        self.norm = gatednorm.RMSNormGated(head_dim, rounding="te")
        self.out = nn.Linear(heads * head_dim, hidden)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        tokens, width = inp.shape[0], self.heads * self.head_dim
        p = self.proj(inp)
        x = p[:, :width].view(tokens, self.heads, self.head_dim)
        gate = p[:, width:].view(tokens, self.heads, self.head_dim)
        return self.out(self.norm(x, gate).reshape(tokens, width))


def train(model: nn.Module, forward, batches, mark_steps: bool) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for inp, target in batches:
        if mark_steps:
            torch.compiler.cudagraph_mark_step_begin()
        loss = (forward(inp).float() - target).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def test_reduce_overhead_training_matches_eager():
    """A few SGD steps of a small bf16 block: torch.compile(mode="reduce-overhead") (CUDA
    graphs for forward and backward) follows the eager run within bf16 rounding."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    hidden, heads, head_dim, tokens = 512, 4, 128, 256
    eager_model = GatedBlock(hidden, heads, head_dim).to(device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        eager_model.norm.weight.normal_(1.0, 0.3)
    compiled_model = copy.deepcopy(eager_model)
    batches = [(torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16),
                torch.randn(tokens, hidden, device="cuda")) for _ in range(4)]

    eager_losses = train(eager_model, eager_model, batches, mark_steps=False)
    compiled = torch.compile(compiled_model, mode="reduce-overhead", fullgraph=True)
    compiled_losses = train(compiled_model, compiled, batches, mark_steps=True)

    assert counters["inductor"]["cudagraph_skips"] == 0, "CUDA graphs were skipped"
    torch.testing.assert_close(torch.tensor(compiled_losses), torch.tensor(eager_losses),
                               rtol=2e-2, atol=1e-3)
    for (name, got), want in zip(compiled_model.named_parameters(), eager_model.parameters()):
        torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1e-3, msg=name)


@pytest.mark.parametrize("d", (128, 20000), ids=("tile-d128", "long-row-d20000"))
def test_cuda_graph_capture_matches_eager(d):
    """Capture y = f(x, gate); y.backward(dy) once (after a warm-up on a side stream, grads
    set to None so backward allocates them from the graph's pool, as in PyTorch's
    whole-network capture example), replay on new data: the same bits as eager."""
    options = Options("te")
    kwargs = options.kwargs()
    tokens = 64
    x = torch.randn(tokens, d, device="cuda", dtype=torch.bfloat16).requires_grad_()
    proj = torch.randn(tokens, 2 * d, device="cuda", dtype=torch.bfloat16)
    gate = proj[:, d:].detach().requires_grad_()  # a leaf view into proj, strided
    weight = (1 + 0.3 * torch.randn(d, device="cuda")).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(tokens, d, device="cuda", dtype=torch.bfloat16)
    leaves = (x, gate, weight)

    def step():
        y = gatednorm.rms_norm_gated(x, gate, weight, **kwargs)
        y.backward(dy)
        return y

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            for leaf in leaves:
                leaf.grad = None
            step()
    torch.cuda.current_stream().wait_stream(side)
    for leaf in leaves:
        leaf.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = step()

    for trial in range(3):
        with torch.no_grad():
            x.copy_(torch.randn_like(x, dtype=torch.float32))
            proj.copy_(torch.randn_like(proj, dtype=torch.float32))
            dy.copy_(torch.randn_like(dy, dtype=torch.float32))
        graph.replay()
        got = {"y": static_y, "dx": x.grad, "dgate": gate.grad, "dweight": weight.grad}
        want = forward_backward(gatednorm.rms_norm_gated,
                                Inputs(x.detach(), gate.detach(), weight.detach(), dy), kwargs)
        changed = [name for name in want if not same_bits(got[name], want[name])]
        assert not changed, f"replay {trial}: {changed} differ from eager"


# --------------------------------------------------------------------------------------------
# The registered ops
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("weight", ("x", "none"))
def test_opcheck(weight):
    """torch.library.opcheck (schema, autograd registration, fake tensors, AOT dispatch with
    dynamic shapes) on CUDA tensors, the gate sliced from a projection."""
    options = Options("te", weight=weight)
    inputs = make_inputs((33, 4, 128), BF16, options, layout="projection")
    op_options = (1e-6, False, "silu", True, 128, "te")
    leaves = [t.detach().requires_grad_() if t is not None else None
              for t in (inputs.x, inputs.gate, inputs.weight)]
    torch.library.opcheck(torch.ops.gatednorm.rms_norm_gated_fwd.default,
                          (*leaves, *op_options))
    _, rstd = torch.ops.gatednorm.rms_norm_gated_fwd(inputs.x, inputs.gate, inputs.weight,
                                                     *op_options)
    torch.library.opcheck(torch.ops.gatednorm.rms_norm_gated_bwd.default,
                          (inputs.dy, inputs.x, inputs.gate, inputs.weight, rstd,
                           *op_options))


def test_registered_op_matches_eager_function():
    """Outside compilation rms_norm_gated uses a plain autograd.Function; the registered op
    (what torch.compile traces) launches the same kernels and must give the same bits."""
    options = Options("hf", zero_centered=True)
    inputs = make_inputs((512, 8, 128), BF16, options, layout="projection")
    kwargs = options.kwargs()

    def via_registered_op(x, gate, weight, *, eps, zero_centered_gamma, activation,
                          norm_before_gate, group_size, rounding):
        y, _ = torch.ops.gatednorm.rms_norm_gated_fwd(
            x, gate, weight, eps, zero_centered_gamma, activation, norm_before_gate,
            group_size or x.shape[-1], rounding)
        return y

    got = forward_backward(via_registered_op, inputs, kwargs)
    want = forward_backward(gatednorm.rms_norm_gated, inputs, kwargs)
    changed = [name for name in want if not same_bits(got[name], want[name])]
    assert not changed, f"{changed} differ between the registered op and the eager Function"
