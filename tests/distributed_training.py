"""Training jobs for tests/distributed_workers.py: a tiny gated block trained a few steps with
the plans users write (tensor parallel over heads, sequence parallel over tokens, FSDP2), on
every rank, against the same model trained on one device from the same initialization.

The losses agree within 1e-5 relative, not bit for bit: the row-parallel output projection
sums its partial products across ranks and FSDP2 averages gradients across ranks, in another
order than one device's matmul and mean; the norm itself is bit for bit (distributed_checks).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInputOutput,
    RowwiseParallel,
    parallelize_module,
)

import gatednorm

DEVICE = "cuda" if torch.cuda.is_available() and dist.get_backend() == "nccl" else "cpu"
STEPS, BATCH, SEQ, HIDDEN, HEADS, HEAD_DIM = 3, 4, 8, 16, 4, 8


class GatedBlock(nn.Module):
    """in_proj and gate_proj -> per-head gated norm -> out_proj: a Gated DeltaNet block's
    projections and output norm, without the recurrence."""

    def __init__(self):
        super().__init__()
        self.in_proj = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.gate_proj = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.norm = gatednorm.RMSNormGated(HEAD_DIM, zero_centered_gamma=True)
        self.out_proj = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)
        with torch.no_grad():
            self.norm.weight.normal_(0.0, 0.2)

    def forward(self, h):
        x = self.in_proj(h).unflatten(-1, (-1, HEAD_DIM))
        gate = self.gate_proj(h).unflatten(-1, (-1, HEAD_DIM))
        return self.out_proj(self.norm(x, gate).flatten(-2))


def _model_and_data():
    torch.manual_seed(0)
    model = nn.Sequential(GatedBlock(), GatedBlock()).to(DEVICE)
    data = torch.randn(STEPS, BATCH, SEQ, HIDDEN, device=DEVICE)
    return model, data


def _train(model, batches, loss_of):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, foreach=False)
    losses = []
    for h in batches:
        optimizer.zero_grad()
        loss = loss_of(model(h))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _mean_square(out):
    return out.pow(2).mean()


def _assert_same_curve(losses, reference, label):
    reference = torch.tensor(reference, dtype=torch.float64)
    got = torch.tensor(losses, dtype=torch.float64)
    assert torch.allclose(got, reference, rtol=1e-5, atol=0), f"{label}: {losses} vs {reference}"


def tensor_parallel_plan(mesh):
    """Heads sharded: the projections column-parallel, the norm on [B, S, H/n, D] shards with a
    replicated weight, the output projection row-parallel."""
    return {
        "in_proj": ColwiseParallel(use_local_output=False),
        "gate_proj": ColwiseParallel(use_local_output=False),
        "out_proj": RowwiseParallel(input_layouts=Shard(-1)),
    }


def _parallelize_heads(model, mesh):
    for block in model:
        parallelize_module(block, mesh, tensor_parallel_plan(mesh))
        distribute_module(block.norm, mesh)  # the weight replicated, as a DTensor
    return model


def _parallelize_tokens(model, mesh):
    """Sequence parallel: the norm's inputs sharded on the token dim, its output gathered."""
    for block in model:
        parallelize_module(block.norm, mesh, PrepareModuleInputOutput(
            input_layouts=(Replicate(), Replicate()),
            desired_input_layouts=(Shard(1), Shard(1)),
            output_layouts=Shard(1), desired_output_layouts=Replicate(),
            use_local_output=True))
        distribute_module(block.norm, mesh)
    return model


def _record_norm_placements(model):
    """The placements each norm's x, gate and output had in the last call."""
    seen = {}

    def hook(module, inputs, output):
        seen[id(module)] = tuple(tuple(t.placements) for t in (*inputs, output))

    for block in model:
        block.norm.register_forward_hook(hook)
    return seen


def tensor_and_sequence_parallel():
    model, data = _model_and_data()
    reference = _train(copy.deepcopy(model), data, _mean_square)
    mesh = init_device_mesh(DEVICE, (dist.get_world_size(),))
    heads = _parallelize_heads(copy.deepcopy(model), mesh)
    seen = _record_norm_placements(heads)
    _assert_same_curve(_train(heads, data, _mean_square), reference, "tensor parallel")
    assert set(seen.values()) == {((Shard(2),),) * 3}, seen
    tokens = _parallelize_tokens(copy.deepcopy(model), mesh)
    _assert_same_curve(_train(tokens, data, _mean_square), reference, "sequence parallel")
    # The gradient of the replicated norm weight is a Partial sum on every rank until the
    # optimizer's update reduces it; both blocks' weights agree with one device's.
    trained = _parallelize_heads(copy.deepcopy(model), mesh)
    _train(trained, data, _mean_square)
    plain = copy.deepcopy(model)
    _train(plain, data, _mean_square)
    for block, plain_block in zip(trained, plain):
        torch.testing.assert_close(block.norm.weight.full_tensor(), plain_block.norm.weight,
                                   rtol=1e-5, atol=1e-6)


def fsdp():
    """FSDP2: each rank trains on its share of the batch; gradients averaged across ranks."""
    from torch.distributed.fsdp import fully_shard

    model, data = _model_and_data()
    reference = _train(copy.deepcopy(model), data, _mean_square)
    n, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh(DEVICE, (n,))
    sharded = copy.deepcopy(model)
    for block in sharded:
        fully_shard(block, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    local = data.chunk(n, dim=1)[rank]

    def global_loss(out):
        return _mean_square(out)

    losses = []
    optimizer = torch.optim.SGD(sharded.parameters(), lr=0.5, foreach=False)
    for h in local:
        optimizer.zero_grad()
        loss = global_loss(sharded(h))
        loss.backward()
        optimizer.step()
        summed = loss.detach().clone()
        dist.all_reduce(summed)
        losses.append(summed.item() / n)
    _assert_same_curve(losses, reference, "FSDP2")


def megatron_sequence_parallel():
    """MegatronGatedRMSNorm with sequence_parallel=True on plain local tensors, as Megatron runs
    it: each tensor-parallel rank normalizes its share of the tokens, then the gradients of the
    parameters marked ``sequence_parallel`` are all-reduced over the tensor-parallel group (what
    Megatron's ``finalize_model_grads`` does for layer norms). y and dx per token are one
    device's bits; the reduced dweight is one device's within summation order."""
    from gatednorm.integrations.megatron import MegatronGatedRMSNorm
    from distributed_checks import assert_dweight_close, assert_same_rows

    n, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    norm = MegatronGatedRMSNorm(HEAD_DIM, eps=1e-6, zero_centered_gamma=True,
                                sequence_parallel=True, device=DEVICE)
    with torch.no_grad():
        norm.weight.normal_(0.0, 0.2)
    x, gate, dy = (torch.randn(SEQ * n, BATCH, HEADS, HEAD_DIM, device=DEVICE)
                   for _ in range(3))
    plain = copy.deepcopy(norm)
    xs = x.clone().requires_grad_()
    plain(xs, gate).backward(dy)

    local_x = x.chunk(n)[rank].clone().requires_grad_()
    y = norm(local_x, gate.chunk(n)[rank])
    y.backward(dy.chunk(n)[rank])
    for param in norm.parameters():
        if getattr(param, "sequence_parallel", False):
            dist.all_reduce(param.grad)
    assert_same_rows(y.detach(), plain(x, gate).detach().chunk(n)[rank], "megatron y")
    assert_same_rows(local_x.grad, xs.grad.chunk(n)[rank], "megatron dx")
    assert_dweight_close(norm.weight.grad, plain.weight.grad, x.numel() // HEAD_DIM)


def compiled_tensor_parallel():
    """torch.compile of the head-parallel model: the same loss curve as one device, eager."""
    model, data = _model_and_data()
    reference = _train(copy.deepcopy(model), data, _mean_square)
    mesh = init_device_mesh(DEVICE, (dist.get_world_size(),))
    heads = _parallelize_heads(copy.deepcopy(model), mesh)
    compiled = torch.compile(heads, fullgraph=True)
    optimizer = torch.optim.SGD(heads.parameters(), lr=0.5, foreach=False)
    losses = []
    for h in data:
        optimizer.zero_grad()
        loss = _mean_square(compiled(h))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    _assert_same_curve(losses, reference, "compiled tensor parallel")
