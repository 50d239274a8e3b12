"""Host time of the Python around an eager launch, on any machine: rms_norm_gated's argument
checks with and without the per-signature memo (functional._CHECKED), with the kernel launch
replaced by a no-op, and the relaunch path (fast_launch.CachedLaunch) with the compiled
kernel's own launcher replaced by a no-op (decode size, 1 x 32 x 128 bf16 CPU tensors).

    TRITON_INTERPRET=1 python benchmarks/check_overhead.py [--out F]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import timeit

import torch

import gatednorm
from gatednorm import functional, ops

CALLS = 100_000
TRIALS = 5


def per_call_us(fn) -> float:
    return min(timeit.repeat(fn, number=CALLS, repeat=TRIALS)) / CALLS * 1e6


def relaunch_us() -> float:
    """One relaunch through a CachedLaunch whose compiled kernel's ``run`` does nothing."""
    from types import SimpleNamespace

    from gatednorm.kernels import fast_launch

    class NoOpCompiled:
        function = packed_metadata = None

        def run(self, *args):
            pass

    tensors = tuple(torch.empty(64) for _ in range(5))
    scalars = tuple(range(14))
    # 5 pointers, 14 scalars and 12 constexprs, like the forward's tile kernel. The first
    # call "compiles" through a stand-in kernel, so the cache holds whatever key this version
    # of fast_launch computes for these pointers.
    cached = fast_launch.CachedLaunch(_StandIn(NoOpCompiled()),
                                      {f"arg{i}": i for i in range(19, 31)})
    fast_launch.driver = SimpleNamespace(
        active=SimpleNamespace(get_current_stream=lambda index: 0))
    cached((1,), tensors, scalars)
    return per_call_us(lambda: cached((100,), tensors, scalars))


class _StandIn:
    """kernel[grid](...) returning a given compiled kernel."""

    arg_names = [f"arg{i}" for i in range(31)]

    def __init__(self, compiled):
        self.compiled = compiled

    def __getitem__(self, grid):
        return lambda *args, **meta: self.compiled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."),
                                                      "check-overhead.json"))
    args = parser.parse_args()
    if not ops.INTERPRET:
        raise SystemExit("run with TRITON_INTERPRET=1 (CPU tensors then take the fused path)")
    x = torch.randn(1, 32, 128, dtype=torch.bfloat16)
    gate = torch.randn_like(x)
    weight = torch.ones(128, dtype=torch.bfloat16)
    ops.eager_rms_norm_gated = lambda x, *rest: x  # time the wrapper, not the kernel
    arguments = (x, gate, weight, 1e-6, False, "silu", True, None, "te")

    def unmemoized():
        functional._CHECKED.clear()
        gatednorm.rms_norm_gated(x, gate, weight)

    results = {
        "rms_norm_gated, checks memoized (launch mocked)":
            per_call_us(lambda: gatednorm.rms_norm_gated(x, gate, weight)),
        "rms_norm_gated, every check run (launch mocked)": per_call_us(unmemoized),
        "functional._signature": per_call_us(lambda: functional._signature(*arguments)),
        "functional._check": per_call_us(lambda: functional._check(*arguments)),
        "dict.clear (subtract from the unmemoized figure)":
            per_call_us(functional._CHECKED.clear),
    }
    results["CachedLaunch relaunch, 5 pointers + 14 scalars (launcher mocked)"] = (
        relaunch_us())
    for name, us in results.items():
        print(f"{name:55s} {us:6.2f} us", flush=True)
    with open(args.out, "w") as handle:
        json.dump(dict(
            machine=platform.processor() or platform.machine(), python=platform.python_version(),
            torch=torch.__version__, date=datetime.date.today().isoformat(),
            command="TRITON_INTERPRET=1 python benchmarks/check_overhead.py",
            method=f"best of {TRIALS} x {CALLS} calls (timeit), 1 x 32 x 128 bf16 CPU tensors",
            per_call_us=results), handle, indent=1)


if __name__ == "__main__":
    main()
