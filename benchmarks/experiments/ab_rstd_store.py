"""Experiment (docs/perf-notes.md, variant 25): what the forward's rstd store costs, and whether
storing it right after the reduction or capping registers (Triton's maxnreg) recovers it.

The forward tile kernel as shipped ("late": rstd stored after y) and a copy of it with the store
moved right after rstd is computed ("early", made from gatednorm/kernels/forward.py by a text
edit at start-up), each with and without the rstd store and with maxnreg None / 40 / 48, beside
FLA's forward (which stores rstd too), timed as the benchmark times (cold L2), two rounds.

    python benchmarks/experiments/ab_rstd_store.py   # on a CUDA machine; writes $OUT/ab-rstd.json

Superseded by variant 27 (ab_shared_offsets.py). Its edit matches the forward.py from before
variant 27: point FORWARD_SOURCE at that file (``git show 5d1b08e:gatednorm/kernels/forward.py``)
and both kernels ("late" and "early") are made from it.
"""

import importlib.util
import json
import os
import tempfile

import torch
import triton

from gatednorm.bench import timing as bt
from gatednorm.kernels import forward as shipped
from gatednorm.kernels import launch

LATE_STORE = """    tl.store(Y + y_rows[:, None] + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    if STORE_RSTD:
        tl.store(RSTD + rows_idx.to(tl.int64) * num_groups + group, rstd, mask=row_mask)
"""
RSTD_LINE = "    rstd = 1.0 / tl.sqrt(mean_square + eps)\n    y = forward_output("


def _module_of(source: str, name: str):
    path = os.path.join(tempfile.mkdtemp(), name + ".py")
    with open(path, "w") as handle:
        handle.write(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SOURCE = open(os.environ.get("FORWARD_SOURCE", shipped.__file__)).read()


def early_store_kernel():
    source = SOURCE
    assert LATE_STORE in source and RSTD_LINE in source, "forward.py changed: update the edit"
    source = source.replace(LATE_STORE, LATE_STORE.split("    if STORE_RSTD")[0], 1)
    source = source.replace(
        RSTD_LINE,
        (
            "    rstd = 1.0 / tl.sqrt(mean_square + eps)\n    if STORE_RSTD:\n"
            "        tl.store(RSTD + rows_idx.to(tl.int64) * num_groups + group, rstd, mask=row_mask)\n"
            "    y = forward_output("
        ),
        1,
    )
    return _module_of(source, "forward_early").forward_tile_kernel


KERNELS = {"late": _module_of(SOURCE, "forward_late").forward_tile_kernel,
           "early": early_store_kernel()}
dev = torch.device("cuda")
copy = bt.copy_bandwidth_gbps(dev, 1 << 30, bt.FULL)
print(f"copy {copy:.0f}", flush=True)
try:
    from fla.modules.norm.fused_norm_gate import rms_norm_gated as fla_fn
except Exception:
    fla_fn = None
recs = []
CASES = [
    ("gdn8192x32", (8192, 32), 128, False),
    ("gdn65536x32", (65536, 32), 128, False),
    ("gdn8192x64", (8192, 64), 128, False),
    ("gdn8192x32-proj", (8192, 32), 128, True),
    ("d256", (196608,), 256, False),
    ("d64", (786432,), 64, False),
    ("d2048", (24576,), 2048, False),
]
for name, lead, d, proj in CASES:
    n = 1
    for v in lead:
        n *= v
    set_bytes = 6 * n * d
    sets = max(2, -(-4 * 60 * 2**20 // set_bytes))
    data = []
    for _ in range(sets):
        x = torch.randn(*lead, d, device=dev, dtype=torch.bfloat16)
        if proj:
            w_ = lead[-1] * d
            p = torch.randn(lead[0], 3 * w_, device=dev, dtype=torch.bfloat16)
            g = p[:, w_ : 2 * w_].view(x.shape)
        else:
            g = torch.randn_like(x)
        data.append(
            (
                x,
                g,
                torch.randn(d, device=dev, dtype=torch.bfloat16),
                torch.empty_like(x),
                torch.empty(n, device=dev),
            )
        )
    launch._PLANS.clear()
    launch.forward(
        data[0][0],
        data[0][1],
        data[0][2],
        eps=1e-6,
        zero_centered_gamma=False,
        activation="silu",
        norm_before_gate=True,
        group_size=d,
        rounding="te",
        traceable=False,
        store_rstd=True,
    )
    plan = next(p for k, p in launch._PLANS.items() if k[0] == "fwd")
    # The edited kernels predate variant 27's launch flags.
    meta = {k: v for k, v in plan.meta.items()
            if k not in ("RSTD_BY_PTX", "GATE_ROWS_AS_X", "Y_ROWS_AS_X")}
    print(
        name,
        "plan",
        plan.kernel.fn.__name__,
        plan.grid,
        {k: meta[k] for k in ("BLOCK_ROWS", "BLOCK_N", "num_warps")},
        flush=True,
    )

    def rec(variant, calls):
        ms = bt.measure(calls, dev, bt.FULL).median_ms
        frac = set_bytes / 1e9 / (ms * 1e-3) / copy
        recs.append(dict(case=name, variant=variant, median_ms=ms, frac_copy=frac))
        print(f"{name:18s} {variant:34s} {ms*1e3:7.1f} us {frac*100:5.1f} %", flush=True)

    if plan.kernel.fn.__name__ != "forward_tile_kernel":
        continue
    for rnd in range(2):
        for kname, kern in KERNELS.items():
            for store in (True, False):
                if kname == "early" and not store:
                    continue
                for maxnreg in (None, 40, 48):
                    m = dict(meta, STORE_RSTD=store)
                    if maxnreg:
                        m["maxnreg"] = maxnreg
                    rec(
                        f"{kname} rstd={int(store)} maxnreg={maxnreg} r{rnd}",
                        [
                            lambda a=a, m=m: kern[plan.grid](
                                a[0], a[1], a[2], a[3], a[4], *plan.layout_args, 1e-6, **m
                            )
                            for a in data
                        ],
                    )
        if fla_fn is not None and not proj:
            rec(
                f"fla r{rnd}",
                [
                    lambda a=a: fla_fn(a[0], a[1], a[2], None, activation="swish", eps=1e-6)
                    for a in data
                ],
            )
    del data
    json.dump(
        dict(
            copy_gbps=copy,
            torch=torch.__version__,
            triton=triton.__version__,
            gpu=torch.cuda.get_device_name(),
            records=recs,
        ),
        open(os.path.join(os.environ.get("OUT", "."), "ab-rstd.json"), "w"),
        indent=1,
    )
