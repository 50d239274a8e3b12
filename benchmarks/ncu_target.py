"""A target program for Nsight Compute: one benchmark case's forward and/or backward, three times.

    ncu --clock-control none -k regex:backward --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section InstructionStats --section MemoryWorkloadAnalysis \
        python benchmarks/ncu_target.py head128-8192x32-silu-bf16-contig bwd

The case is any name of ``python -m gatednorm.bench --list`` (its shape, dtype, gate layout
and options); the passes are ``fwd``, ``bwd`` or ``fwd,bwd``. The op runs through the public
API (``gatednorm.rms_norm_gated`` and autograd), so the kernels and launches are exactly a
user's. The third call of each pass is the one to profile: the first two compile and warm up.

An FP8 format name (``gatednorm.quantize.FORMAT_NAMES``) as a third argument runs the forward
with ``quantize=`` that format, on x and the gate flattened to ``[tokens, H * D]`` as a GDN
layer passes them::

    ncu --clock-control none -k regex:columnwise --launch-skip 2 --launch-count 1 \
        --set full python benchmarks/ncu_target.py head128-8192x32-silu-bf16-contig fwd \
        1x128_columnwise
"""

from __future__ import annotations

import sys

import torch

import gatednorm
from gatednorm.bench import cases


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    name, passes = argv[:2]
    quantize = argv[2] if len(argv) == 3 else None
    by_name = {c.name: c for c in cases.full_cases()}
    if name not in by_name:
        print(f"unknown case {name!r}; see python -m gatednorm.bench --list", file=sys.stderr)
        return 2
    case = by_name[name]
    inputs = case.make_inputs(torch.device("cuda"), seed=0)
    options = dict(activation=case.activation, norm_before_gate=case.norm_before_gate,
                   group_size=case.group_size)
    if quantize is not None:
        # Blocks run along the flattened last dim: [tokens, H, D] -> [tokens, H * D], in
        # groups of D (a case without a group size normalizes its whole last dim).
        options["group_size"] = case.group_size or inputs.x.shape[-1]
        x, gate = (t.flatten(-2) if t.dim() > 2 else t for t in (inputs.x, inputs.gate))
        weight = None if inputs.weight is None else inputs.weight.repeat(
            x.shape[-1] // inputs.weight.shape[-1])
        for _ in range(3):
            with torch.no_grad():
                gatednorm.rms_norm_gated(x, gate, weight, quantize=quantize, **options)
        torch.cuda.synchronize()
        return 0
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
