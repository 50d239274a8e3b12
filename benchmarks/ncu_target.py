"""A target program for Nsight Compute: one case's forward and/or backward, three times.

    ncu --clock-control none -k regex:backward_tile --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section InstructionStats --section MemoryWorkloadAnalysis \
        python benchmarks/ncu_target.py gdn8192x32-contig bwd

(the third launch is profiled: the first two compile and warm up).
"""
import sys
import torch
from gatednorm.kernels import launch
case, passes = sys.argv[1], sys.argv[2]
CASES = {
    "gdn8192x32-contig": ((8192, 32), 128, 128, True, False),
    "gdn8192x32-proj": ((8192, 32), 128, 128, True, True),
    "mamba2": ((8192,), 5120, 640, False, False),
    "nemotronh": ((8192,), 8192, 1024, False, False),
    "d96": ((524288,), 96, 96, True, False),
    "d4096": ((12288,), 4096, 4096, True, False),
}
lead, d, group, nbg, proj = CASES[case]
dt = torch.bfloat16
x = torch.randn(*lead, d, device="cuda", dtype=dt)
if proj:
    p = torch.randn(lead[0], 3 * lead[1] * d, device="cuda", dtype=dt)
    gate = p[:, lead[1] * d:2 * lead[1] * d].view(x.shape)
else:
    gate = torch.randn_like(x)
w = torch.randn(d, device="cuda", dtype=dt)
dy = torch.randn_like(x)
common = dict(zero_centered_gamma=False, activation="silu", norm_before_gate=nbg,
              group_size=group, rounding="te", traceable=False)
_, rstd = launch.forward(x, gate, w, eps=1e-6, **common)
for _ in range(3):
    if "fwd" in passes:
        launch.forward(x, gate, w, eps=1e-6, store_rstd=False, **common)
    if "bwd" in passes:
        launch.backward(dy, x, gate, w, rstd, **common)
torch.cuda.synchronize()
