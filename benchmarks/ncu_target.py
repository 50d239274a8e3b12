"""A target program for Nsight Compute: one benchmark case's forward and/or backward, three times.

    ncu --clock-control none -k regex:backward --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section InstructionStats --section MemoryWorkloadAnalysis \
        python benchmarks/ncu_target.py head128-8192x32-silu-bf16-contig bwd

The case is any name of ``python -m gatednorm.bench --list`` (its shape, dtype, gate layout
and options); the passes are ``fwd``, ``bwd`` or ``fwd,bwd``. The op runs through the public
API (``gatednorm.rms_norm_gated`` and autograd), so the kernels and launches are exactly a
user's. The third call of each pass is the one to profile: the first two compile and warm up.
"""

from __future__ import annotations

import sys

import torch

import gatednorm
from gatednorm.bench import cases


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    name, passes = argv
    by_name = {c.name: c for c in cases.full_cases()}
    if name not in by_name:
        print(f"unknown case {name!r}; see python -m gatednorm.bench --list", file=sys.stderr)
        return 2
    case = by_name[name]
    inputs = case.make_inputs(torch.device("cuda"), seed=0)
    options = dict(activation=case.activation, norm_before_gate=case.norm_before_gate,
                   group_size=case.group_size)
    for _ in range(3):
        if "fwd" in passes:
            with torch.no_grad():
                gatednorm.rms_norm_gated(inputs.x, inputs.gate, inputs.weight, **options)
        if "bwd" in passes and not case.is_decode:
            y = gatednorm.rms_norm_gated(inputs.x, inputs.gate, inputs.weight, **options)
            torch.autograd.grad(y, inputs.differentiable(), inputs.dy)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
