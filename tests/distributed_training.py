"""Training jobs for tests/distributed_workers.py: the model and plans of
examples/distributed_plans.py (tensor parallel over GDN heads and Mamba2 groups, sequence
parallel over tokens, FSDP2, torch.compile), trained a few steps on every rank, against the same
model trained on one device from the same initialization.

The losses agree within 1e-5 relative, not bit for bit: the row-parallel output projection
sums its partial products across ranks and FSDP2 averages gradients across ranks, in another
order than one device's matmul and mean; the norm itself is bit for bit (distributed_checks).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard

from distributed_checks import DEVICE, assert_dweight_close, assert_same_rows
from distributed_plans import (
    BATCH,
    HEAD_DIM,
    HEADS,
    SEQ,
    Mamba2Block,
    batches_for,
    parallelize_heads,
    parallelize_tokens,
    tiny_model,
    train,
    train_fsdp,
)


def _mesh():
    return init_device_mesh(DEVICE, (dist.get_world_size(),))


def _assert_same_curve(losses, reference, label):
    reference = torch.tensor(reference, dtype=torch.float64)
    got = torch.tensor(losses, dtype=torch.float64)
    assert torch.allclose(got, reference, rtol=1e-5, atol=0), f"{label}: {losses} vs {reference}"


def _record_norm_placements(model):
    """Each norm's x, gate and output placements in its last call, by block type."""
    seen = {}

    def recorder(name):
        def hook(module, inputs, output):
            seen[name] = tuple(tuple(t.placements) for t in (*inputs, output))

        return hook

    for block in model:
        block.norm.register_forward_hook(recorder(type(block).__name__))
    return seen


def _setup():
    model, data = tiny_model(DEVICE), batches_for(DEVICE)
    return model, data, train(copy.deepcopy(model), data)


def tensor_and_sequence_parallel():
    model, data, reference = _setup()
    heads = parallelize_heads(copy.deepcopy(model), _mesh())
    seen = _record_norm_placements(heads)
    _assert_same_curve(train(heads, data), reference, "tensor parallel")
    # GDN: heads (dim 2 of [B, S, H, D]) sharded; Mamba2: the inner width in whole groups.
    assert seen == {"GatedDeltaNetBlock": ((Shard(2),),) * 3,
                    "Mamba2Block": ((Shard(2),),) * 3}, seen
    plain = copy.deepcopy(model)
    train(plain, data)
    # The replicated GDN norm weight's gradient is a Partial sum until the optimizer's update
    # reduces it; the sharded Mamba2 one is a shard. Both weights end as one device's.
    for block, plain_block in zip(heads, plain):
        expected = Shard(0) if isinstance(block, Mamba2Block) else None
        if expected is not None:
            assert tuple(block.norm.weight.placements) == (expected,)
        torch.testing.assert_close(block.norm.weight.full_tensor(), plain_block.norm.weight,
                                   rtol=1e-5, atol=1e-6)
    tokens = parallelize_tokens(copy.deepcopy(model), _mesh())
    _assert_same_curve(train(tokens, data), reference, "sequence parallel")


def fsdp():
    """FSDP2: each rank trains on its share of the batch; gradients averaged across ranks."""
    model, data, reference = _setup()
    _assert_same_curve(train_fsdp(copy.deepcopy(model), data, _mesh()), reference, "FSDP2")


def compiled_tensor_parallel():
    """torch.compile(fullgraph=True) of the head-parallel model: one device's loss curve."""
    model, data, reference = _setup()
    heads = parallelize_heads(copy.deepcopy(model), _mesh())
    losses = train(heads, data, compiled=torch.compile(heads, fullgraph=True))
    _assert_same_curve(losses, reference, "compiled tensor parallel")


def megatron_sequence_parallel():
    """MegatronGatedRMSNorm with sequence_parallel=True on plain local tensors, as Megatron runs
    it: each tensor-parallel rank normalizes its share of the tokens, then the gradients of the
    parameters marked ``sequence_parallel`` are all-reduced over the tensor-parallel group (what
    Megatron's ``finalize_model_grads`` does for layer norms). y and dx per token are one
    device's bits; the reduced dweight is one device's within summation order."""
    from gatednorm.integrations.megatron import MegatronGatedRMSNorm

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
    y_plain = plain(xs, gate)
    y_plain.backward(dy)

    local_x = x.chunk(n)[rank].clone().requires_grad_()
    y = norm(local_x, gate.chunk(n)[rank])
    y.backward(dy.chunk(n)[rank])
    for param in norm.parameters():
        if getattr(param, "sequence_parallel", False):
            dist.all_reduce(param.grad)
    assert_same_rows(y.detach(), y_plain.detach().chunk(n)[rank], "megatron y")
    assert_same_rows(local_x.grad, xs.grad.chunk(n)[rank], "megatron dx")
    assert_dweight_close(norm.weight.grad, plain.weight.grad, x.numel() // HEAD_DIM)
