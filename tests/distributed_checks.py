"""Jobs run on every rank by tests/distributed_workers.py (one function per job).

Every rank builds the same full tensors from the same seed, runs the plain single-device op on
them (the 1-rank result), then the DTensor op on its shards, and compares the gathered results:
y, dx and dgate bit for bit (each row or group is computed by the same code on either side),
dweight within fp32 summation-order tolerance (the ranks' partial sums are added in another
order than one device's), and the output placements against the rules.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

import gatednorm
from gatednorm import ops
from conftest import make_inputs, nan_poisoned_empty

DEVICE = "cuda" if torch.cuda.is_available() and dist.get_backend() == "nccl" else "cpu"


def _mesh(*shape):
    return init_device_mesh(DEVICE, shape)


def _gathered(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def assert_same_rows(actual, expected, label):
    """Bit for bit where the kernels run (each group is computed by the same code whatever the
    shard's shape). The CPU reference composite's vectorized reductions may round a group's
    sum differently in tensors of other shapes: within four units of the dtype at the top of
    the range there (dx cancels terms, so the bound is absolute)."""
    if ops.INTERPRET or DEVICE == "cuda":
        assert torch.equal(actual, expected), (
            f"{label} differs from one device's by {(actual - expected).abs().max()}")
        return
    eps = torch.finfo(expected.dtype).eps
    allowed = 4 * eps * expected.double().abs().max().item()
    error = (actual.double() - expected.double()).abs().max().item()
    assert error <= allowed, f"{label} differs from one device's by {error:.3e} > {allowed:.3e}"


def assert_dweight_close(actual, expected, rows):
    """The ranks' fp32 partial sums, each rounded to the weight's dtype, are added in another
    order than one device's sum: within a few roundings of the weight's dtype and
    sqrt(rows) fp32 ulps of the largest magnitude."""
    eps = torch.finfo(expected.dtype).eps
    scale = expected.double().abs().max().item()
    allowed = (4 * eps + 4 * torch.finfo(torch.float32).eps * rows ** 0.5) * scale
    error = (actual.double() - expected.double()).abs().max().item()
    assert error <= allowed, f"dweight differs by {error:.3e}, allowed {allowed:.3e}"


def run_case(mesh, shape, placements, *, gate_placements=None, weight_placements=None,
             dy_placements=None, dtype=torch.float32, has_weight=True, expect_y=None, expect_dweight=None,
             **options):
    torch.manual_seed(1234)
    x, gate, weight, dy = make_inputs(shape, dtype, has_weight=has_weight,
                                      zero_centered_gamma=options.get("zero_centered_gamma",
                                                                      False))
    x, gate, dy = (t.to(DEVICE) for t in (x, gate, dy))
    weight = None if weight is None else weight.to(DEVICE)
    leaves = [t.clone().requires_grad_() for t in (x, gate)]
    w_leaf = None if weight is None else weight.clone().requires_grad_()
    with nan_poisoned_empty():
        y_plain = gatednorm.rms_norm_gated(*leaves, w_leaf, **options)
    y_plain.backward(dy)

    dx_ = distribute_tensor(x, mesh, placements).requires_grad_()
    dg_ = distribute_tensor(gate, mesh, gate_placements or placements).requires_grad_()
    dw_ = None
    if weight is not None:
        dw_ = distribute_tensor(
            weight, mesh, weight_placements or [Replicate()] * mesh.ndim).requires_grad_()
    with nan_poisoned_empty():
        y = gatednorm.rms_norm_gated(dx_, dg_, dw_, **options)
        assert isinstance(y, DTensor), type(y)
        if expect_y is not None:
            assert tuple(y.placements) == tuple(expect_y), (y.placements, expect_y)
        y.backward(distribute_tensor(dy, mesh, dy_placements or y.placements))
    label = f"{shape} {placements} {options}"
    for name, got, want in (("y", y, y_plain), ("dx", dx_.grad, leaves[0].grad),
                            ("dgate", dg_.grad, leaves[1].grad)):
        full = _gathered(got)
        assert full.dtype == want.dtype and full.shape == want.shape, (name, label)
        assert_same_rows(full, want, f"{name} for {label}")
    if weight is not None:
        if expect_dweight is not None:
            assert tuple(dw_.grad.placements) == tuple(expect_dweight), (
                dw_.grad.placements, expect_dweight, label)
        rows = x.numel() // shape[-1]
        assert_dweight_close(_gathered(dw_.grad), w_leaf.grad, rows)


def _expect_error(kind, fragments, fn):
    try:
        fn()
    except kind as error:
        message = str(error)
        for fragment in fragments:
            assert fragment in message, f"{fragment!r} not in {message!r}"
        return
    raise AssertionError(f"no {kind.__name__} raised")


def placements():
    """Forward and backward under every supported placement on a 1-D mesh of all ranks."""
    n = dist.get_world_size()
    mesh = _mesh(n)
    # Leading-dim shards: batch, tokens (uneven), heads; dweight a Partial sum.
    run_case(mesh, (2 * n, 3, 16), [Shard(0)], expect_y=[Shard(0)],
             expect_dweight=[Partial()])
    run_case(mesh, (2, 2 * n + 1, 2, 8), [Shard(1)], expect_y=[Shard(1)],
             expect_dweight=[Partial()], norm_before_gate=False, rounding="fp32",
             activation="sigmoid")
    run_case(mesh, (1, 3, 2 * n, 8), [Shard(2)], expect_y=[Shard(2)],
             expect_dweight=[Partial()], rounding="hf", zero_centered_gamma=True)
    run_case(mesh, (2 * n, 16), [Shard(0)], has_weight=False, expect_y=[Shard(0)],
             group_size=4)
    # Low precision with an fp32 gate and weight: y, dx, dgate still bit for bit.
    run_case(mesh, (n, 4, 16), [Shard(0)], dtype=torch.float16, expect_y=[Shard(0)],
             expect_dweight=[Partial()], rounding="te")
    # The last dim in shards of whole groups, the weight sharded alike.
    run_case(mesh, (3, 4 * n), [Shard(1)], weight_placements=[Shard(0)], group_size=4,
             expect_y=[Shard(1)], expect_dweight=[Shard(0)], norm_before_gate=False)
    # A replicated weight is sharded to x's columns; Shard(-1) is Shard(ndim - 1).
    run_case(mesh, (2, 3, 8 * n), [Shard(-1)], group_size=8, expect_y=[Shard(2)],
             expect_dweight=[Shard(0)], rounding="hf")
    # The gate (and dy) are redistributed to x's placement; a replicated x stays replicated.
    run_case(mesh, (2 * n, 2 * n, 8), [Shard(0)], gate_placements=[Shard(1)],
             dy_placements=[Replicate()], dtype=torch.bfloat16, expect_y=[Shard(0)],
             expect_dweight=[Partial()])
    run_case(mesh, (4, 8), [Replicate()], gate_placements=[Shard(0)],
             expect_y=[Replicate()], expect_dweight=[Replicate()])
    partial_x_is_reduced_first(mesh)
    errors(mesh)


def partial_x_is_reduced_first(mesh):
    """A Partial x (a row-parallel output before its reduction) is summed before the norm."""
    x, gate, weight, _ = make_inputs((4, 8), torch.float32)
    x, gate, weight = (t.to(DEVICE) for t in (x, gate, weight))
    expected = gatednorm.rms_norm_gated(x, gate, weight)
    replicated = [distribute_tensor(t, mesh, [Replicate()]) for t in (x, gate, weight)]
    # Rank 0 holds x, the others zeros: the sum is x exactly.
    share = x if dist.get_rank() == 0 else torch.zeros_like(x)
    partial = DTensor.from_local(share, mesh, [Partial()], run_check=False)
    y = gatednorm.rms_norm_gated(partial, *replicated[1:])
    assert tuple(y.placements) == (Replicate(),), y.placements
    assert_same_rows(y.full_tensor(), expected, "y of a Partial x")


def errors(mesh):
    n = mesh.size()
    x = distribute_tensor(torch.randn(4, 8 * n, device=DEVICE), mesh, [Shard(1)])
    w = torch.ones(8 * n, device=DEVICE)
    # The whole row is one group: a last-dim shard splits it.
    _expect_error(ValueError, ["x has placements (Shard(dim=1),)", "group_size=" + str(8 * n)],
                  lambda: gatednorm.rms_norm_gated(x, x, None))
    # Shards of 8 columns split groups of 16.
    _expect_error(ValueError, ["splits groups of group_size=16"],
                  lambda: gatednorm.rms_norm_gated(x, x, None, group_size=16))
    _expect_error(TypeError, ["weight must be a DTensor", "plain Tensor"],
                  lambda: gatednorm.rms_norm_gated(x, x, w, group_size=8))
    _expect_error(TypeError, ["gate must be a DTensor"],
                  lambda: gatednorm.rms_norm_gated(x, x.full_tensor(), None, group_size=8))
    other = init_device_mesh(DEVICE, (1, n))
    gate = distribute_tensor(torch.randn(4, 8 * n, device=DEVICE), other,
                             [Replicate(), Shard(1)])
    _expect_error(ValueError, ["gate must be on x's device mesh"],
                  lambda: gatednorm.rms_norm_gated(x, gate, None, group_size=8))


def placements_2d():
    """A 2 x (n/2) mesh: rows on one mesh dim, whole groups of columns on the other."""
    n = dist.get_world_size()
    mesh = _mesh(2, n // 2)
    run_case(mesh, (4, 3, 8 * n), [Shard(0), Shard(2)], group_size=4,
             expect_y=[Shard(0), Shard(2)], expect_dweight=[Partial(), Shard(0)])
    run_case(mesh, (4, 2 * n, 8), [Shard(1), Replicate()], gate_placements=[Replicate(), Shard(0)],
             expect_y=[Shard(1), Replicate()], expect_dweight=[Partial(), Replicate()])
    # Uneven whole groups on the last dim: 14 columns in groups of 2 over 4 ranks -> 4, 4, 4, 2.
    flat = _mesh(n)
    if n == 4:
        run_case(flat, (3, 14), [Shard(1)], group_size=2, expect_y=[Shard(1)],
                 expect_dweight=[Shard(0)])
