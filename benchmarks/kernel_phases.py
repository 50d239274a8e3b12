"""Per-kernel GPU time of gatednorm's forward and backward (torch.profiler), L2 flushed first.

    python benchmarks/kernel_phases.py OUT.json [case,case,...]

For each case: the forward, the backward (main kernel + the two dweight reduction launches)
and the backward without a weight (main kernel only), 12 times each with a 512 MB write in
between; prints and writes the median span of each launch sequence and of each kernel in it.
It answers "how much of the backward is the dweight reduction" (docs/perf-notes.md).
"""
import datetime
import json
import statistics
import sys

import torch
from torch.profiler import profile, ProfilerActivity
from gatednorm.kernels import launch

from kernel_cases import CASES, case_inputs

torch.manual_seed(0)
names = sys.argv[2].split(",") if len(sys.argv) > 2 else list(CASES)
flush = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda")
out = []
for name in names:
    x, gate, w, dy, common = case_inputs(name)
    _, rstd = launch.forward(x, gate, w, eps=1e-6, **common)
    for weight in (w, None):
        launch.backward(dy, x, gate, weight, rstd, **common)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(12):
            flush.zero_()
            launch.forward(x, gate, w, eps=1e-6, store_rstd=False, **common)
            flush.zero_()
            launch.backward(dy, x, gate, w, rstd, **common)
            flush.zero_()
            launch.backward(dy, x, gate, None, rstd, **common)
        torch.cuda.synchronize()
    ev = [e for e in prof.events() if str(e.device_type).endswith("CUDA")]
    ev.sort(key=lambda e: e.time_range.start)
    # sequence per iteration: flush, fwd, flush, bwd, red, red, flush, bwd(no weight)
    seqs = []
    cur = []
    for e in ev:
        if e.name.startswith(("forward", "backward", "dweight")):
            cur.append(e)
        else:
            if cur:
                seqs.append(cur)
            cur = []
    if cur:
        seqs.append(cur)
    groups = {}
    for s in seqs:
        key = "+".join(e.name.split("_kernel")[0] for e in s)
        span = s[-1].time_range.end - s[0].time_range.start
        g = groups.setdefault(key, {"span": [], "parts": [[] for _ in s]})
        g["span"].append(span)
        for i, e in enumerate(s):
            g["parts"][i].append(e.time_range.end - e.time_range.start)
    for key, g in groups.items():
        med = statistics.median(g["span"][2:] or g["span"])
        parts = [statistics.median(p[2:] or p) for p in g["parts"]]
        elems = x.numel()
        rec = dict(case=name, kernels=key, span_us=med, parts_us=parts, n=len(g["span"]),
                   elements=elems)
        out.append(rec)
        print(f"{name:22s} {key:60s} span {med:8.2f} us parts {['%.2f' % p for p in parts]}", flush=True)
    del x, gate, dy, rstd
result = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
              date=datetime.date.today().isoformat(),
              command="python benchmarks/kernel_phases.py " + " ".join(sys.argv[1:]),
              records=out)
json.dump(result, open(sys.argv[1], "w"), indent=1)
