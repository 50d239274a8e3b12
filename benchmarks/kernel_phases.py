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

torch.manual_seed(0)
dev = "cuda"
CASES = {
    # name: (leading shape, d, group, norm_before_gate, proj)
    "gdn4096x32-contig": ((4096, 32), 128, 128, True, False),
    "gdn8192x32-contig": ((8192, 32), 128, 128, True, False),
    "gdn8192x32-proj": ((8192, 32), 128, 128, True, True),
    "gdn65536x32-contig": ((65536, 32), 128, 128, True, False),
    "gdn65536x32-proj": ((65536, 32), 128, 128, True, True),
    "mamba2-contig": ((8192,), 5120, 640, False, False),
    "nemotronh-contig": ((8192,), 8192, 1024, False, False),
    "d1024": ((49152,), 1024, 1024, True, False),
    "d4096": ((12288,), 4096, 4096, True, False),
    "d8192": ((6144,), 8192, 8192, True, False),
    "d16384": ((3072,), 16384, 16384, True, False),
}
names = sys.argv[2].split(",") if len(sys.argv) > 2 else list(CASES)
flush = torch.empty(512 * 2**20, dtype=torch.uint8, device=dev)
out = []
for name in names:
    lead, d, group, nbg, proj = CASES[name]
    dt = torch.bfloat16
    x = torch.randn(*lead, d, device=dev, dtype=dt)
    if proj:
        p = torch.randn(*lead[:-1], lead[-1] * 3 * d if len(lead) > 1 else 3 * d, device=dev, dtype=dt)
        width = lead[-1] * d if len(lead) > 1 else d
        gate = p[..., width:2 * width].view(x.shape)
    else:
        gate = torch.randn_like(x)
    w = torch.randn(d, device=dev, dtype=dt)
    dy = torch.randn_like(x)
    common = dict(zero_centered_gamma=False, activation="silu", norm_before_gate=nbg,
                  group_size=group, rounding="te", traceable=False)
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
