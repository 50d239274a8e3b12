"""Experiment (docs/perf-notes.md, variant 45): what dweight costs the eager backward. Times
``launch.backward`` per shape with the weight (the main kernel also loads the weight and writes
one fp32 partial row per chunk; two reduction launches chained by programmatic dependent
launch sum them) and without it (none of that), cold, as the benchmark times, two rounds.

    python benchmarks/experiments/backward_dweight_cost.py gdn4096x32,d64   # on a CUDA machine;
    # shapes from benchmarks/launch_sweep.py SHAPES; writes $OUT/backward-dweight-cost.json
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import launch_sweep  # noqa: E402
from gatednorm.kernels import launch  # noqa: E402


def main() -> None:
    records = []
    for round_name in ("r1", "r2"):
        for name in sys.argv[1].split(","):
            shape = launch_sweep.SHAPES[name]
            inputs = launch_sweep.make_inputs(shape, torch.bfloat16, "contiguous")
            time_call = launch_sweep.make_timer("cold", shape, torch.bfloat16, "contiguous",
                                                inputs)
            options = dict(group_size=shape.group_size, norm_before_gate=shape.norm_before_gate,
                           traceable=False, zero_centered_gamma=False, activation="silu",
                           rounding="te")
            rstds = {}

            def rstd_of(x, gate, weight):
                # Once per input set, outside the timed calls.
                if x.data_ptr() not in rstds:
                    rstds[x.data_ptr()] = launch.forward(x, gate, weight, eps=1e-6,
                                                         **options)[1]
                return rstds[x.data_ptr()]

            with_weight = time_call(lambda x, g, w, dy: launch.backward(
                dy, x, g, w, rstd_of(x, g, w), **options))
            without = time_call(lambda x, g, w, dy: launch.backward(
                dy, x, g, None, rstd_of(x, g, w), **options))
            records.append(dict(round=round_name, shape=name, with_weight_us=with_weight * 1e3,
                                without_weight_us=without * 1e3))
            print(f"{round_name} {name:12s} with weight {with_weight * 1e3:7.1f} us, without "
                  f"{without * 1e3:7.1f} us ({(with_weight / without - 1) * 100:+.1f} %)",
                  flush=True)
    path = os.path.join(os.environ.get("OUT", "."), "backward-dweight-cost.json")
    with open(path, "w") as handle:
        json.dump(dict(gpu=torch.cuda.get_device_name(), records=records), handle, indent=1)


if __name__ == "__main__":
    main()
