"""Where the host time of one eager gatednorm call goes, step by step, on a CUDA machine.

    python benchmarks/host_overhead.py [--out F]

Each step is timed on its own as the mean wall time of many back-to-back calls (the GPU work
they queue is tiny, decode size 1 x 32 x 128 bf16), so the steps show what the eager call
spends before and around its kernel launch. Writes a JSON file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time

import torch
import triton
from triton.runtime.driver import driver

import gatednorm
from gatednorm import GatedNormOptions, ops
from gatednorm.kernels import launch
from gatednorm.validation import check_group_size, check_options, check_tensors

CALLS = 3000


def per_call_us(fn, calls: int = CALLS) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."),
                                                      "host-overhead.json"))
    args = parser.parse_args()
    x = torch.randn(1, 32, 128, device="cuda", dtype=torch.bfloat16)
    gate = torch.randn_like(x)
    weight = torch.ones(128, device="cuda", dtype=torch.bfloat16)
    weight_grad = weight.clone().requires_grad_()
    x_grad = x.clone().requires_grad_()
    options = dict(zero_centered_gamma=False, activation="silu", norm_before_gate=True,
                   group_size=128, rounding="te")
    y = torch.empty_like(x)

    def validate():
        check_options(eps=1e-6, activation="silu", rounding="te", zero_centered_gamma=False,
                      norm_before_gate=True)
        check_tensors(x, gate, weight, False)
        check_group_size(None, x.shape[-1])

    y_ref, rstd_ref = launch.forward(x, gate, weight, eps=1e-6, traceable=False, **options)
    dy = torch.randn_like(x)
    steps = {
        "torch.empty": lambda: torch.empty(x.shape, dtype=x.dtype, device=x.device),
        "torch.empty_like": lambda: torch.empty_like(x),
        "validation": validate,
        "torch.compiler.is_compiling": torch.compiler.is_compiling,
        "plan key": lambda: ("fwd", x.shape, x.stride(), gate.stride(), x.dtype, gate.dtype,
                             weight.dtype, 128, False, "silu", True, "te", False),
        "3 x data_ptr": lambda: (x.data_ptr(), gate.data_ptr(), y.data_ptr()),
        "triton launch (kernel[grid])": None,
        "launch.forward, no rstd (cached relaunch)": lambda: launch.forward(
            x, gate, weight, eps=1e-6, traceable=False, store_rstd=False, **options),
        "ops.eager, no grad": lambda: ops.eager(
            x, gate, weight, GatedNormOptions(1e-6, False, "silu", True, 128, "te")),
        "rms_norm_gated, no grad (bound inference launcher)": lambda: gatednorm.rms_norm_gated(
            x, gate, weight),
        "rms_norm_gated, grad enabled (autograd.Function)": lambda: gatednorm.rms_norm_gated(
            x_grad, gate, weight_grad),
        "launch.backward (cached relaunch, 3 launches)": lambda: launch.backward(
            dy, x, gate, weight, rstd_ref, traceable=False, **options),
    }
    plan = next(p for p in launch.cached_plans("fwd") if p.cached_launch is not None)
    plan_args = (x, gate, weight, y, y, *plan.layout_args, 1e-6)
    steps["triton launch (kernel[grid])"] = lambda: plan.kernel[plan.grid](*plan_args,
                                                                          **plan.meta)
    tensors, scalars = plan_args[:5], plan_args[5:]
    steps["CachedLaunch (relaunch path)"] = lambda: plan.cached_launch(plan.grid, tensors,
                                                                       scalars)
    steps["CachedLaunch, a new y each call"] = lambda: plan.cached_launch(
        plan.grid, (x, gate, weight, *(2 * [torch.empty_like(x)])), scalars)
    compiled = next(iter(plan.cached_launch.compiled.values()), None)
    if compiled is not None:
        constexprs = plan.cached_launch.constexpr_values
        stream = torch.cuda.current_stream().cuda_stream
        addresses = tuple(t.data_ptr() for t in tensors)
        steps["compiled.run, pointers as ints"] = lambda: compiled.run(
            plan.grid[0], 1, 1, stream, compiled.function, compiled.packed_metadata, None,
            None, None, *addresses, *scalars, *constexprs)
        steps["compiled.run, pointers as tensors"] = lambda: compiled.run(
            plan.grid[0], 1, 1, stream, compiled.function, compiled.packed_metadata, None,
            None, None, *tensors, *scalars, *constexprs)
        relaunch_fn, head = next(iter(plan.cached_launch.relaunch.values()))
        name = getattr(relaunch_fn, "__name__", type(relaunch_fn).__name__)
        steps[f"relaunch function ({name})"] = (
            lambda: relaunch_fn(plan.grid[0], 1, 1, stream, *head, *addresses, *scalars,
                                *constexprs))
        steps["driver.active.get_current_stream"] = (
            lambda: driver.active.get_current_stream(0))
    results = {}
    for name, fn in steps.items():
        results[name] = per_call_us(fn)
        print(f"{name:55s} {results[name]:7.2f} us", flush=True)
    document = dict(
        gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
        python=platform.python_version(), date=datetime.date.today().isoformat(),
        command="python benchmarks/host_overhead.py",
        method=f"mean host wall time of {CALLS} back-to-back calls, one synchronize, "
               "1 x 32 x 128 bf16", per_call_us=results)
    with open(args.out, "w") as handle:
        json.dump(document, handle, indent=1)


if __name__ == "__main__":
    main()
