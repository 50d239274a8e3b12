"""Host time of rms_norm_gated's argument checks, with and without the per-signature memo
(functional._CHECKED), on any machine: the kernel launch is replaced by a no-op, so only the
Python wrapper is timed (decode size, 1 x 32 x 128 bf16 on the CPU through the interpreter's
dispatch decision).

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
