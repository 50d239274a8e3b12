"""Sweep launch configs on the GPU: kernel time via CUDA-graph replays, registers and spills.

Run on a CUDA machine from the repository root: ``python benchmarks/launch_sweep.py``. Writes
tune.json under $OUT (or the working directory). It replaces gatednorm's config functions for
the duration of the sweep; the committed table in gatednorm/kernels/config.py was read off
its output (benchmarks/results/h200-2026-12-02-launch-sweep.json).
"""
import json, os, sys, time
import torch, triton
from triton.testing import do_bench_cudagraph, do_bench
import gatednorm
from gatednorm.kernels import launch, config as cfgmod
from gatednorm.kernels.config import LaunchConfig
from gatednorm.kernels import forward as fk, backward as bk
dev = "cuda"
out = os.environ.get("OUT", ".")
n = 1 << 28
a = torch.empty(n, dtype=torch.uint8, device=dev); b = torch.empty_like(a)
copy = 2 * n / do_bench(lambda: b.copy_(a), return_mode="median") / 1e6
print("copy GB/s %.0f" % copy, flush=True)
results = []

def regs(kernel):
  try:
    best = None
    for dc in kernel.device_caches.values():
        for k in dc[0].values():
            best = (k.n_regs, k.n_spills)
    return best
  except Exception as e:
    return repr(e)[:80]

def clear(kernel):
  try:
    for dc in kernel.device_caches.values():
        dc[0].clear()
  except Exception:
    pass

def time_graph(fn):
    return do_bench_cudagraph(fn, rep=60, return_mode="median")

opts = dict(eps=1e-6, zero_centered_gamma=False, activation="silu", norm_before_gate=True, rounding="te")
SHAPES = [(128, 128 << 20 >> 7 >> 1), (1024, 65536), (4096, 16384), (8192, 8192), (16384, 4096), (32768, 2048)]
mode = sys.argv[1] if len(sys.argv) > 1 else "all"
for d, rows in SHAPES:
    x = torch.randn(rows, d, device=dev, dtype=torch.bfloat16)
    g = torch.randn(rows, d, device=dev, dtype=torch.bfloat16)
    w = torch.randn(d, device=dev, dtype=torch.bfloat16)
    dy = torch.randn(rows, d, device=dev, dtype=torch.bfloat16)
    nel = rows * d
    bn = triton.next_power_of_2(d)
    # forward
    fcands = []
    for br in [1, 2, 4, 8, 16, 32, 64, 128]:
        for nw in [1, 2, 4, 8, 16, 32]:
            te = br * bn
            if te > 32768 or te < 256 or te // (32 * nw) < 4 or te // (32 * nw) > 32: continue
            fcands.append(LaunchConfig(br, bn, nw, False))
    if bn > 16384:
        fcands += [LaunchConfig(1, c, nw, True) for c in (2048, 4096) for nw in (8, 16)]
    best = None
    for c in fcands:
        launch.forward_config = lambda gs, c=c: c
        launch._PLANS.clear()
        try:
            ms = time_graph(lambda: launch.forward(x, g, w, group_size=d, traceable=False, **opts))
        except Exception as e:
            print("fwd fail", d, c, repr(e)[:200]); continue
        k = fk.forward_long_row_kernel if c.long_row else fk.forward_tile_kernel
        r = regs(k); clear(k)
        frac = 6 * nel / ms / 1e6 / copy
        results.append(dict(pass_="fwd", d=d, rows=rows, cfg=c.__dict__, ms=ms, frac=frac, regs=r))
        if best is None or ms < best[0]: best = (ms, c)
        print(f"fwd d={d} {c.block_rows}x{c.block_n} w{c.num_warps} long={c.long_row} {ms*1e3:.1f}us {frac*100:.1f}% regs={r}", flush=True)
    print("BEST fwd", d, best, flush=True)
    launch.forward_config = cfgmod.forward_config
    y, rstd = launch.forward(x, g, w, group_size=d, traceable=False, **{k: v for k, v in opts.items()})
    bopts = {k: v for k, v in opts.items() if k != "eps"}
    bcands = []
    for br in [1, 2, 4, 8, 16, 32, 64]:
        for nw in [2, 4, 8, 16, 32]:
            te = br * bn
            if te > 16384 or te < 512 or te // (32 * nw) < 4 or te // (32 * nw) > 16: continue
            bcands.append(LaunchConfig(br, bn, nw, False))
    if bn > 8192:
        bcands += [LaunchConfig(1, c, nw, True) for c in (2048, 4096) for nw in (8, 16)]
    best = None
    for c in bcands:
        for target in (1056, 4224, 16896):
            launch.backward_config = lambda gs, c=c: c
            cfgmod.BACKWARD_TARGET_PROGRAMS = target
            launch._PLANS.clear()
            try:
                ms = time_graph(lambda: launch.backward(dy, x, g, w, rstd, group_size=d, traceable=False, **bopts))
            except Exception as e:
                print("bwd fail", d, c, repr(e)[:200]); continue
            k = bk.backward_long_row_kernel if c.long_row else bk.backward_tile_kernel
            r = regs(k); clear(k)
            frac = 10 * nel / ms / 1e6 / copy
            results.append(dict(pass_="bwd", d=d, rows=rows, cfg=c.__dict__, target=target, ms=ms, frac=frac, regs=r))
            if best is None or ms < best[0]: best = (ms, c, target)
            print(f"bwd d={d} {c.block_rows}x{c.block_n} w{c.num_warps} long={c.long_row} T={target} {ms*1e3:.1f}us {frac*100:.1f}% regs={r}", flush=True)
    print("BEST bwd", d, best, flush=True)
    launch.backward_config = cfgmod.backward_config
    cfgmod.BACKWARD_TARGET_PROGRAMS = 1024
    del x, g, y
json.dump(dict(copy_gbps=copy, results=results), open(os.path.join(out, "tune.json"), "w"), indent=1)

# host overhead of the eager call (decode sizes)
from gatednorm.kernels.layout import row_layout
def per_call(fn, n=2000):
    for _ in range(20): fn()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize(); return (time.perf_counter() - t) / n * 1e6
x = torch.randn(64, 32, 128, device=dev, dtype=torch.bfloat16); g = torch.randn_like(x); w = torch.ones(128, device=dev, dtype=torch.bfloat16)
y = torch.empty_like(x); rs = torch.empty(64*32, device=dev)
print("empty us", per_call(lambda: torch.empty(x.shape, dtype=x.dtype, device=x.device)))
print("row_layout us", per_call(lambda: row_layout([x, g, y], 128)))
args = (x, g, w, y, rs, 64*32, 1, 1, 0, 0, 128, 0, 0, 128, 0, 0, 128, 128, 1, 1e-6)
meta = dict(LEADING_DIMS=1, ROW_ALIGN=8, BLOCK_ROWS=8, BLOCK_N=128, HAS_WEIGHT=True, ZERO_CENTERED=False, ACTIVATION=0, NORM_BEFORE_GATE=True, ROUNDING=0, num_warps=4)
print("raw triton launch us", per_call(lambda: fk.forward_tile_kernel[(256,)](*args, **meta)))
print("launch.forward us", per_call(lambda: launch.forward(x, g, w, group_size=128, traceable=False, **opts)))
print("functional nograd us", per_call(lambda: gatednorm.rms_norm_gated(x, g, w)))
wr = w.clone().requires_grad_()
print("functional grad-enabled fwd us", per_call(lambda: gatednorm.rms_norm_gated(x, g, wr)))
for r in [1, 16, 256, 4096]:
    xx = torch.randn(r, 32, 128, device=dev, dtype=torch.bfloat16); gg = torch.randn_like(xx)
    print("decode rows", r, "eager us", per_call(lambda: gatednorm.rms_norm_gated(xx, gg, w)))
    gr = torch.cuda.CUDAGraph()
    s_ = torch.cuda.Stream(); s_.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s_):
        for _ in range(3): gatednorm.rms_norm_gated(xx, gg, w)
    torch.cuda.current_stream().wait_stream(s_)
    with torch.cuda.graph(gr): yy = gatednorm.rms_norm_gated(xx, gg, w)
    print("decode rows", r, "graph replay us", per_call(gr.replay))
x = torch.randn(1, 32, 128, device=dev, dtype=torch.bfloat16); g = torch.randn_like(x); w = torch.ones(128, device=dev, dtype=torch.bfloat16)
for _ in range(10): gatednorm.rms_norm_gated(x, g, w)
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(1000): gatednorm.rms_norm_gated(x, g, w)
torch.cuda.synchronize(); print("eager call us", (time.perf_counter() - t) * 1e3)
t = time.perf_counter()
for _ in range(1000): launch.forward(x, g, w, group_size=128, traceable=False, **opts)
torch.cuda.synchronize(); print("launcher call us", (time.perf_counter() - t) * 1e3)
