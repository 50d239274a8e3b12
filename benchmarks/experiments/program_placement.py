"""Experiment (docs/perf-notes.md, variant 48): how the H200 places N one-warp programs on its
SMs when all of them fit at once. Each program records the SM it runs on (%smid) after holding
its SM for a while (so that every program is resident at the same time, as the backward's are);
printed: for each N, how many SMs got how many programs.

    python benchmarks/experiments/program_placement.py 1024,1040,1046,1056   # on a CUDA machine
"""

from __future__ import annotations

import collections
import json
import os
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def placement_kernel(SM_OF_PROGRAM, spin_ns):
    start = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                      is_pure=False, pack=1)
    now = start
    while now - start < spin_ns:
        now = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                        is_pure=False, pack=1)
    sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32,
                                   is_pure=False, pack=1)
    tl.store(SM_OF_PROGRAM + tl.program_id(0), sm)


def main() -> None:
    results = []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for programs in (int(n) for n in sys.argv[1].split(",")):
        sm_of_program = torch.full((programs,), -1, dtype=torch.int32, device="cuda")
        placement_kernel[(programs,)](sm_of_program, 200_000, num_warps=1)
        torch.cuda.synchronize()
        per_sm = collections.Counter(sm_of_program.tolist())
        histogram = collections.Counter(per_sm.values())
        histogram[0] = sms - len(per_sm)
        results.append(dict(programs=programs, sms_by_programs=dict(sorted(histogram.items())),
                            first_sms=sm_of_program[:16].tolist()))
        print(f"{programs:5d} programs: SMs by programs {dict(sorted(histogram.items()))}, "
              f"first programs on SMs {sm_of_program[:16].tolist()}", flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "program-placement.json"), "w") as f:
        json.dump(dict(gpu=torch.cuda.get_device_name(), sms=sms, results=results), f, indent=1)


if __name__ == "__main__":
    main()
