"""Experiment (docs/perf-notes.md, variant 27): the shipped kernels with their launch flags
turned off one at a time, timed through the eager launchers as the benchmark times (cold L2).

Flags (set by gatednorm/kernels/launch.py): ``*_ROWS_AS_X`` (a tensor whose row strides equal
x's is addressed with x's row offsets) and ``RSTD_BY_PTX`` (the forward stores rstd by inline
PTX, from the reduction's layout). ``--before PATH`` adds the forward kernels of an older
forward.py (the tree before variant 27) with the flags removed.

    python benchmarks/experiments/ab_shared_offsets.py --before .dev/forward_head.py
    # on a CUDA machine; writes $OUT/ab-shared-offsets.json
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os

import torch
import triton

from gatednorm.bench import timing
from gatednorm.kernels import launch
from gatednorm.kernels.fast_launch import CachedLaunch

NEW_FORWARD_FLAGS = ("GATE_ROWS_AS_X", "Y_ROWS_AS_X", "RSTD_BY_PTX")
OWN = {"GATE_ROWS_AS_X": False, "Y_ROWS_AS_X": False}
OWN_BACKWARD = {"GATE_ROWS_AS_X": False, "DY_ROWS_AS_X": False, "DX_ROWS_AS_X": False,
                "DGATE_ROWS_AS_X": False}
# (label, meta overrides); "SHARED" stands for every tensor whose strides equal x's.
FORWARD_VARIANTS = [
    ("shipped", {}),
    ("tl.store after y, own rows", dict(OWN, RSTD_BY_PTX=False)),
    ("ptx, own rows", dict(OWN, RSTD_BY_PTX=True)),
    ("ptx, shared rows", {"SHARED": True, "RSTD_BY_PTX": True}),
    ("tl.store after y, shared rows", {"SHARED": True, "RSTD_BY_PTX": False}),
    ("no rstd, own rows", dict(OWN, STORE_RSTD=False, RSTD_BY_PTX=False)),
    ("no rstd, shared rows", {"SHARED": True, "STORE_RSTD": False, "RSTD_BY_PTX": False}),
]
BACKWARD_VARIANTS = [
    ("shipped", {}),
    ("own rows", OWN_BACKWARD),
    ("shared rows", {"SHARED": True}),
]
# (name, x shape, group size, gate first, gate layout, dtype)
bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
CASES = [
    ("gdn8192x32", (8192, 32, 128), 128, False, "contiguous", bf16),
    ("gdn8192x64", (8192, 64, 128), 128, False, "contiguous", bf16),
    ("gdn65536x32", (65536, 32, 128), 128, False, "contiguous", bf16),
    ("gdn8192x32-proj", (8192, 32, 128), 128, False, "proj", bf16),
    ("gdn65536x32-proj", (65536, 32, 128), 128, False, "proj", bf16),
    ("gdn8192x32-fp16", (8192, 32, 128), 128, False, "contiguous", fp16),
    ("gdn8192x32-fp32", (8192, 32, 128), 128, False, "contiguous", fp32),
    ("mamba2-8192x5120-g640", (8192, 5120), 640, True, "contiguous", bf16),
    ("d64-786432r", (786432, 64), 64, False, "contiguous", bf16),
    ("d96-524288r", (524288, 96), 96, False, "contiguous", bf16),
    ("d256-196608r", (196608, 256), 256, False, "contiguous", bf16),
    ("d1024-49152r", (49152, 1024), 1024, False, "contiguous", bf16),
    ("d4096-12288r", (12288, 4096), 4096, False, "contiguous", bf16),
    ("d192-262144r", (262144, 192), 192, False, "contiguous", bf16),
    ("d64-786432r-fp16", (786432, 64), 64, False, "contiguous", fp16),
    ("d96-524288r-fp16", (524288, 96), 96, False, "contiguous", fp16),
    ("d192-262144r-fp16", (262144, 192), 192, False, "contiguous", fp16),
    ("d256-196608r-fp16", (196608, 256), 256, False, "contiguous", fp16),
    ("mamba2-8192x5120-g640-fp16", (8192, 5120), 640, True, "contiguous", fp16),
    ("sigmoid4096x96", (4096, 96, 128), 128, False, "contiguous", bf16),
    ("sigmoid4096x96-proj", (4096, 96, 128), 128, False, "proj", bf16),
]
# Cases named "sigmoid..." gate with a sigmoid (Kimi Linear), the others with SiLU.


def _overrides(overrides: dict, gate_layout: str, backward: bool) -> dict:
    if not overrides.pop("SHARED", False):
        return overrides
    shared = {"GATE_ROWS_AS_X": gate_layout == "contiguous"}
    shared.update({"DY_ROWS_AS_X": True, "DX_ROWS_AS_X": True, "DGATE_ROWS_AS_X": True}
                  if backward else {"Y_ROWS_AS_X": True})
    return dict(shared, **overrides)


def _kernels_of(path: str):
    spec = importlib.util.spec_from_file_location("forward_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _replan(key, kernel, meta) -> None:
    plan = launch._PLANS[key]
    launch._PLANS[key] = dataclasses.replace(plan, kernel=kernel, meta=meta,
                                             cached_launch=CachedLaunch(kernel, meta))


def _inputs(shape, gate_layout, device, dtype):
    x = torch.randn(shape, device=device, dtype=dtype)
    if gate_layout == "proj":
        width = x.numel() // shape[0]
        gate = torch.randn(shape[0], 3 * width, device=device, dtype=dtype)
        gate = gate[:, width:2 * width].view(shape)
    else:
        gate = torch.randn(shape, device=device, dtype=dtype)
    weight = torch.randn(shape[-1], device=device, dtype=dtype)
    dy = torch.randn(shape, device=device, dtype=dtype)
    return x, gate, weight, dy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="an older forward.py to time beside")
    parser.add_argument("--cases", help="comma-separated names to run (default: all)")
    parser.add_argument("--passes", default="fwd,bwd")
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."),
                                                      "ab-shared-offsets.json"))
    args = parser.parse_args()
    before = _kernels_of(args.before) if args.before else None
    try:
        from fla.modules.norm.fused_norm_gate import rms_norm_gated as fla_fn
    except ImportError:
        fla_fn = None
    device = torch.device("cuda")
    copy_gbps = timing.copy_bandwidth_gbps(device, 1 << 30, timing.FULL)
    records = []

    def record(case, pass_, label, round_, ms, bytes_, same_bits):
        frac = bytes_ / 1e9 / (ms * 1e-3) / copy_gbps
        records.append(dict(case=case, pass_=pass_, variant=label, round=round_, median_ms=ms,
                            frac_copy=frac, same_bits=same_bits))
        print(f"{case:22s} {pass_} r{round_} {label:26s} {ms * 1e3:7.1f} us {frac * 100:5.1f} %"
              f" same bits {same_bits}", flush=True)

    wanted = args.cases.split(",") if args.cases else [case[0] for case in CASES]
    passes = args.passes.split(",")
    for case, shape, group_size, gate_first, gate_layout, dtype in CASES:
        if case not in wanted:
            continue
        numel = torch.Size(shape).numel()
        size = dtype.itemsize
        sets = max(2, -(-4 * 60 * 2**20 // (5 * size * numel)))
        data = [_inputs(shape, gate_layout, device, dtype) for _ in range(sets)]
        activation = "sigmoid" if case.startswith("sigmoid") else "silu"
        options = dict(zero_centered_gamma=False, activation=activation,
                       norm_before_gate=not gate_first, group_size=group_size, rounding="te",
                       traceable=False)
        launch._PLANS.clear()

        def forward(a):
            return launch.forward(a[0], a[1], a[2], eps=1e-6, **options)

        def backward(a, rstd):
            return launch.backward(a[3], a[0], a[1], a[2], rstd, **options)

        y_ref, rstd_ref = forward(data[0])
        bwd_ref = backward(data[0], rstd_ref)
        rstds = [forward(a)[1] for a in data]
        forward_key = next(k for k in launch._PLANS if k[0] == "fwd")
        backward_key = next(k for k in launch._PLANS if k[0] == "bwd")
        forward_plan, backward_plan = launch._PLANS[forward_key], launch._PLANS[backward_key]
        kernel_name = forward_plan.kernel.fn.__name__
        print(f"{case}: forward {kernel_name} {forward_plan.meta}", flush=True)

        forward_trials = [
            (label, forward_plan.kernel,
             dict(forward_plan.meta, **_overrides(dict(overrides), gate_layout, False)))
            for label, overrides in FORWARD_VARIANTS
            if all(k in forward_plan.meta for k in overrides if k != "SHARED")]
        if before is not None and kernel_name != "forward_long_row_kernel":
            old_meta = {k: v for k, v in forward_plan.meta.items() if k not in NEW_FORWARD_FLAGS}
            forward_trials.insert(0, ("before", getattr(before, kernel_name), old_meta))
        backward_trials = [
            (label, backward_plan.kernel,
             dict(backward_plan.meta, **_overrides(dict(overrides), gate_layout, True)))
            for label, overrides in BACKWARD_VARIANTS
            if all(k in backward_plan.meta for k in overrides if k != "SHARED")]
        for round_ in (1, 2):
            for label, kernel, meta in forward_trials if "fwd" in passes else []:
                _replan(forward_key, kernel, meta)
                y, rstd = forward(data[0])
                same = torch.equal(y, y_ref) and (not meta["STORE_RSTD"]
                                                  or torch.equal(rstd, rstd_ref))
                ms = timing.measure([lambda a=a: forward(a) for a in data], device,
                                    timing.FULL).median_ms
                record(case, "fwd", label, round_, ms, 3 * size * numel, same)
            _replan(forward_key, forward_plan.kernel, forward_plan.meta)
            if (fla_fn is not None and not gate_first and group_size == shape[-1]
                    and "fwd" in passes):
                ms = timing.measure(
                    [lambda a=a: fla_fn(a[0], a[1], a[2], None, eps=1e-6,
                                        activation="swish" if activation == "silu" else activation)
                     for a in data], device, timing.FULL).median_ms
                record(case, "fwd", "fla", round_, ms, 3 * size * numel, None)
            for label, kernel, meta in backward_trials if "bwd" in passes else []:
                _replan(backward_key, kernel, meta)
                out = backward(data[0], rstd_ref)
                same = all(torch.equal(a, b) for a, b in zip(out, bwd_ref))
                ms = timing.measure([lambda a=a, r=r: backward(a, r)
                                     for a, r in zip(data, rstds)], device,
                                    timing.FULL).median_ms
                record(case, "bwd", label, round_, ms, 5 * size * numel, same)
            _replan(backward_key, backward_plan.kernel, backward_plan.meta)
        del data, rstds
        torch.cuda.empty_cache()
        with open(args.out, "w") as handle:
            json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                           triton=triton.__version__, copy_gbps=copy_gbps, records=records),
                      handle, indent=1)


if __name__ == "__main__":
    main()
