"""Experiment (docs/perf-notes.md, variant 27): the shipped kernels with their launch flags
turned off one at a time, timed through the eager launchers as the benchmark times (cold L2).

Flags (set by gatednorm/kernels/launch.py): ``*_ROWS_AS_X`` (a tensor whose row strides equal
x's is addressed with x's row offsets) and ``RSTD_BY_PTX`` (the forward stores rstd by inline
PTX, from the reduction's layout). ``--before PATH`` adds the forward kernels of an older
forward.py (the tree before variant 27) with the flags removed.

    python benchmarks/experiments/ab_shared_offsets.py --before .dev/forward_head.py
    # on a CUDA machine; writes $OUT/ab-shared-offsets.json
    python benchmarks/experiments/ab_shared_offsets.py --passes bwd --maxnreg 96,128 \
        --cases gdn8192x32,gdn8192x32-proj   # the backward with ptxas register caps
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
from gatednorm.bench.cases import Case
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
def _case(name, shape, dtype, gate_layout="contiguous", activation="silu", group_size=None):
    return Case(name, "ab", shape, dtype, gate_layout=gate_layout, activation=activation,
                norm_before_gate=group_size is None, group_size=group_size)


# The benchmark's inputs (gatednorm.bench.cases); group_size given: the gate-first cases.
bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
CASES = [
    _case("gdn8192x32", (8192, 32, 128), bf16),
    _case("gdn8192x64", (8192, 64, 128), bf16),
    _case("gdn65536x32", (65536, 32, 128), bf16),
    _case("gdn8192x32-proj", (8192, 32, 128), bf16, "proj"),
    _case("gdn65536x32-proj", (65536, 32, 128), bf16, "proj"),
    _case("gdn8192x32-fp16", (8192, 32, 128), fp16),
    _case("gdn8192x32-fp32", (8192, 32, 128), fp32),
    _case("mamba2-8192x5120-g640", (8192, 5120), bf16, group_size=640),
    _case("d64-786432r", (786432, 64), bf16),
    _case("d96-524288r", (524288, 96), bf16),
    _case("d256-196608r", (196608, 256), bf16),
    _case("d1024-49152r", (49152, 1024), bf16),
    _case("d4096-12288r", (12288, 4096), bf16),
    _case("d192-262144r", (262144, 192), bf16),
    _case("d64-786432r-fp16", (786432, 64), fp16),
    _case("d96-524288r-fp16", (524288, 96), fp16),
    _case("d192-262144r-fp16", (262144, 192), fp16),
    _case("d256-196608r-fp16", (196608, 256), fp16),
    _case("mamba2-8192x5120-g640-fp16", (8192, 5120), fp16, group_size=640),
    _case("sigmoid4096x96", (4096, 96, 128), bf16, activation="sigmoid"),
    _case("sigmoid4096x96-proj", (4096, 96, 128), bf16, "proj", activation="sigmoid"),
]


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


def _inputs(case: Case, device: torch.device, seed: int) -> tuple:
    """(x, gate, weight, dy) of the benchmark's inputs, detached: the launchers are called
    directly, and FLA's forward is timed without building a graph."""
    inputs = case.make_inputs(device, seed)
    return tuple(t.detach() for t in (inputs.x, inputs.gate, inputs.weight, inputs.dy))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="an older forward.py to time beside")
    parser.add_argument("--cases", help="comma-separated names to run (default: all)")
    parser.add_argument("--passes", default="fwd,bwd")
    parser.add_argument("--maxnreg", default="",
                        help="also time the shipped backward with ptxas capped at each of "
                             "these register counts (comma-separated; variant 32)")
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

    wanted = args.cases.split(",") if args.cases else [case.name for case in CASES]
    passes = args.passes.split(",")
    for spec in CASES:
        if spec.name not in wanted:
            continue
        case, gate_layout, activation = spec.name, spec.gate_layout, spec.activation
        # Sets of inputs rotated through four times the L2 (60 MB), so every call is L2-cold.
        sets = max(2, -(-4 * 60 * 2**20 // spec.bytes_allocated()))
        data = [_inputs(spec, device, seed) for seed in range(sets)]
        options = dict(zero_centered_gamma=False, activation=activation,
                       norm_before_gate=spec.norm_before_gate, group_size=spec.group,
                       rounding="te", traceable=False)
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
        backward_trials += [(f"maxnreg {cap}", backward_plan.kernel,
                             dict(backward_plan.meta, maxnreg=int(cap)))
                            for cap in filter(None, args.maxnreg.split(","))]
        for round_ in (1, 2):
            for label, kernel, meta in forward_trials if "fwd" in passes else []:
                _replan(forward_key, kernel, meta)
                y, rstd = forward(data[0])
                same = torch.equal(y, y_ref) and (not meta["STORE_RSTD"]
                                                  or torch.equal(rstd, rstd_ref))
                ms = timing.measure([lambda a=a: forward(a) for a in data], device,
                                    timing.FULL).median_ms
                record(case, "fwd", label, round_, ms, spec.bytes_moved("fwd"), same)
            _replan(forward_key, forward_plan.kernel, forward_plan.meta)
            if (fla_fn is not None and spec.norm_before_gate and spec.group == spec.d
                    and "fwd" in passes):
                ms = timing.measure(
                    [lambda a=a: fla_fn(a[0], a[1], a[2], None, eps=1e-6,
                                        activation="swish" if activation == "silu" else activation)
                     for a in data], device, timing.FULL).median_ms
                record(case, "fwd", "fla", round_, ms, spec.bytes_moved("fwd"), None)
            for label, kernel, meta in backward_trials if "bwd" in passes else []:
                _replan(backward_key, kernel, meta)
                out = backward(data[0], rstd_ref)
                same = all(torch.equal(a, b) for a, b in zip(out, bwd_ref))
                ms = timing.measure([lambda a=a, r=r: backward(a, r)
                                     for a, r in zip(data, rstds)], device,
                                    timing.FULL).median_ms
                record(case, "bwd", label, round_, ms, spec.bytes_moved("bwd"), same)
            _replan(backward_key, backward_plan.kernel, backward_plan.meta)
        del data, rstds
        torch.cuda.empty_cache()
        with open(args.out, "w") as handle:
            json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                           triton=triton.__version__, copy_gbps=copy_gbps, records=records),
                      handle, indent=1)


if __name__ == "__main__":
    main()
