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
from kernel_cases import case_inputs

case, passes = sys.argv[1], sys.argv[2]
x, gate, w, dy, common = case_inputs(case)
_, rstd = launch.forward(x, gate, w, eps=1e-6, **common)
for _ in range(3):
    if "fwd" in passes:
        launch.forward(x, gate, w, eps=1e-6, store_rstd=False, **common)
    if "bwd" in passes:
        launch.backward(dy, x, gate, w, rstd, **common)
torch.cuda.synchronize()
