"""gatednorm under tensor parallelism, sequence parallelism and FSDP2: the plans, on a tiny model.

    torchrun --nproc-per-node 2 examples/distributed_plans.py           # CUDA ranks with NCCL
    python examples/distributed_plans.py --cpu-ranks 2                  # CPU ranks with gloo

Each plan trains the same two-block model from the same weights for a few steps and prints its
loss curve beside the one of a single device. The blocks are the projections and output norm of
a Gated DeltaNet layer (per-head norm, ``norm_before_gate=True``) and of a Mamba2 layer (norm over
the inner width in groups, ``norm_before_gate=False``), without their recurrences:

- ``heads``:  Megatron-style tensor parallelism. The input projections are column-parallel and
  return DTensors, so the norm sees x and gate sharded on the heads dim (GDN) or on the inner
  width in whole groups (Mamba2); the output projection is row-parallel. Nothing is gathered
  around the norm.
- ``tokens``: sequence parallelism. The norm's inputs are sharded on the token dim.
- ``fsdp``:   FSDP2 (``fully_shard``) on every block and the root; each rank trains on its share
  of the batch.
"""

from __future__ import annotations

import argparse
import copy
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInputOutput,
    RowwiseParallel,
    parallelize_module,
)

import gatednorm

STEPS, BATCH, SEQ, HIDDEN, HEADS, HEAD_DIM, GROUPS = 3, 4, 8, 16, 4, 8, 4


class GatedDeltaNetBlock(nn.Module):
    """in_proj, gate_proj -> gated norm over each head's HEAD_DIM values -> out_proj."""

    def __init__(self):
        super().__init__()
        self.in_proj = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.gate_proj = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.norm = gatednorm.RMSNormGated(HEAD_DIM, zero_centered_gamma=True)
        self.out_proj = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)

    def forward(self, h):
        x = self.in_proj(h).unflatten(-1, (-1, HEAD_DIM))
        gate = self.gate_proj(h).unflatten(-1, (-1, HEAD_DIM))
        return self.out_proj(self.norm(x, gate).flatten(-2))


class Mamba2Block(nn.Module):
    """in_proj, gate_proj -> gated norm over the inner width in GROUPS groups, gate first ->
    out_proj. Tensor parallelism shards the inner width by whole groups."""

    def __init__(self):
        super().__init__()
        inner = HEADS * HEAD_DIM
        self.in_proj = nn.Linear(HIDDEN, inner, bias=False)
        self.gate_proj = nn.Linear(HIDDEN, inner, bias=False)
        self.norm = gatednorm.RMSNormGated(inner, group_size=inner // GROUPS,
                                           norm_before_gate=False)
        self.out_proj = nn.Linear(inner, HIDDEN, bias=False)

    def forward(self, h):
        return self.out_proj(self.norm(self.in_proj(h), self.gate_proj(h)))


def tiny_model(device) -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(GatedDeltaNetBlock(), Mamba2Block()).to(device)
    with torch.no_grad():
        for block in model:
            block.norm.weight.normal_(0.0, 0.2)
    return model


def shard_weight_by_columns(name, module, mesh):
    # Mamba2's norm weight follows the inner width: each rank holds its groups' weights.
    for key, param in list(module.named_parameters()):
        module.register_parameter(
            key, nn.Parameter(distribute_tensor(param.detach(), mesh, [Shard(0)])))


def parallelize_heads(model: nn.Sequential, mesh) -> nn.Sequential:
    """Tensor parallelism: column-parallel input projections returning DTensors (so the norm
    runs on shards), the norm's weight replicated (GDN, heads sharded) or sharded like the
    inner width (Mamba2, whole groups), row-parallel output projection."""
    plan = {"in_proj": ColwiseParallel(use_local_output=False),
            "gate_proj": ColwiseParallel(use_local_output=False),
            "out_proj": RowwiseParallel(input_layouts=Shard(-1))}
    for block in model:
        parallelize_module(block, mesh, plan)
        if isinstance(block, Mamba2Block):
            distribute_module(block.norm, mesh, shard_weight_by_columns)
        else:
            distribute_module(block.norm, mesh)  # replicated weight
    return model


def parallelize_tokens(model: nn.Sequential, mesh) -> nn.Sequential:
    """Sequence parallelism: the norm's x and gate sharded on the token dim (dim 1), its output
    gathered for the next projection; the weight replicated."""
    for block in model:
        parallelize_module(block.norm, mesh, PrepareModuleInputOutput(
            input_layouts=(Replicate(), Replicate()),
            desired_input_layouts=(Shard(1), Shard(1)),
            output_layouts=Shard(1), desired_output_layouts=Replicate(),
            use_local_output=True))
        distribute_module(block.norm, mesh)
    return model


def shard_fsdp(model: nn.Sequential, mesh) -> nn.Sequential:
    from torch.distributed.fsdp import fully_shard

    for block in model:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def train(model, batches, *, compiled=None) -> list[float]:
    """SGD steps on the mean square of the output; the losses. ``compiled`` runs the forward
    (a torch.compile of ``model``) where given."""
    forward = compiled or model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, foreach=False)
    losses = []
    for h in batches:
        optimizer.zero_grad()
        loss = forward(h).pow(2).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def train_fsdp(model, batches, mesh) -> list[float]:
    """FSDP2 on ``mesh``: each rank trains on its slice of every batch; the global losses."""
    n, rank = mesh.size(), mesh.get_local_rank()
    local = [h.chunk(n)[rank] for h in batches]
    losses = []
    for loss in train(shard_fsdp(model, mesh), local):
        total = torch.tensor(loss, dtype=torch.float64, device=batches[0].device)
        dist.all_reduce(total)
        losses.append(total.item() / n)
    return losses


def batches_for(device) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(BATCH, SEQ, HIDDEN, generator=generator).to(device)
            for _ in range(STEPS)]


def main_on_rank(device: str) -> None:
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    model, data = tiny_model(device), batches_for(device)
    curves = {"one device": train(copy.deepcopy(model), data),
              "heads": train(parallelize_heads(copy.deepcopy(model), mesh), data),
              "tokens": train(parallelize_tokens(copy.deepcopy(model), mesh), data),
              "fsdp": train_fsdp(copy.deepcopy(model), data, mesh)}
    if dist.get_rank() == 0:
        for name, losses in curves.items():
            print(f"{name:>10}: " + "  ".join(f"{loss:.6f}" for loss in losses))


def _cpu_rank(rank: int, world_size: int, rendezvous: str) -> None:
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world_size)
    try:
        main_on_rank("cpu")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu-ranks", type=int, default=0,
                        help="spawn this many CPU ranks (gloo) instead of running under torchrun")
    args = parser.parse_args()
    if args.cpu_ranks:
        import tempfile

        import torch.multiprocessing as mp

        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(_cpu_rank, args=(args.cpu_ranks, f"file://{tmp}/rendezvous"),
                     nprocs=args.cpu_ranks)
    else:
        dist.init_process_group("nccl")
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        try:
            main_on_rank("cuda")
        finally:
            dist.destroy_process_group()
