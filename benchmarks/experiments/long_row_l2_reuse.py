"""Experiment (docs/perf-notes.md, variant 46): can the cut long-row backward read its inputs a
second time from L2 instead of DRAM?

The shipped backward for groups wider than a register tile (variant 28) runs two launches over
all rows: the first reads x, gate and dy for each row's dot products, the second reads them
again for dx and dgate: 16 bytes an element from DRAM in 16-bit dtypes instead of 10. If the
rows were processed in slices small enough for L2 (60 MB on the H200), the second read of a
slice would come from L2. This times, inside CUDA graphs (so that the extra launches cost GPU
time only, not host time), the shipped backward over all rows against the same two launches
run slice by slice, for several slice sizes, rotated over input sets so that L2 is cold at the
start of each call. Without a weight (no dweight partials, which the slicing would multiply),
and the shipped backward with a weight for reference.

    python benchmarks/experiments/long_row_l2_reuse.py d16384,d32768   # on a CUDA machine;
    # shapes from benchmarks/launch_sweep.py SHAPES; writes $OUT/long-row-l2-reuse.json
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import launch_sweep  # noqa: E402
from gatednorm.bench import timing as bench_timing  # noqa: E402
from gatednorm.kernels import config, launch  # noqa: E402

SLICE_MEGABYTES = (6, 12, 24, 48, 96)  # input bytes (x, gate, dy) of one slice


def main() -> None:
    records = []
    dtype = torch.bfloat16
    device = torch.device("cuda")
    for name in sys.argv[1].split(","):
        shape = launch_sweep.SHAPES[name]
        options = dict(group_size=shape.group_size, norm_before_gate=shape.norm_before_gate,
                       traceable=False, zero_centered_gamma=False, activation="silu",
                       rounding="te")
        set_bytes = 6 * shape.rows * shape.d * dtype.itemsize
        sets = max(bench_timing.MIN_SETS, -(-bench_timing.ROTATION_L2_MULTIPLE
                                           * bench_timing.l2_bytes(device) // set_bytes))
        input_sets = []
        for _ in range(sets):
            x, gate, weight, dy = launch_sweep.make_inputs(shape, dtype, "contiguous")
            rstd = launch.forward(x, gate, weight, eps=1e-6, **options)[1]
            input_sets.append((x, gate, weight, dy, rstd))
        row_bytes = 3 * shape.d * dtype.itemsize

        def time_graphs(make_call):
            replays = [bench_timing.capture_graph(make_call(*inputs)) for inputs in input_sets]
            return bench_timing.measure(replays, device, bench_timing.FULL).median_ms * 1e3

        variants = {
            "shipped, weight": lambda x, g, w, dy, r: (
                lambda: launch.backward(dy, x, g, w, r, **options)),
            "shipped, no weight": lambda x, g, w, dy, r: (
                lambda: launch.backward(dy, x, g, None, r, **options)),
        }
        for megabytes in SLICE_MEGABYTES:
            slice_rows = max(1, megabytes * 2**20 // row_bytes)
            if slice_rows >= shape.rows:
                continue

            def sliced(x, g, w, dy, r, slice_rows=slice_rows):
                def call():
                    # A slice's chunks may be single rows (the shipped minimum of 16 would
                    # leave a 64-row slice 32 programs); plans are built on the first call.
                    saved = config.MIN_ROWS_PER_CHUNK
                    config.MIN_ROWS_PER_CHUNK = 1
                    try:
                        for start in range(0, shape.rows, slice_rows):
                            part = slice(start, start + slice_rows)
                            launch.backward(dy[part], x[part], g[part], None, r[part],
                                            **options)
                    finally:
                        config.MIN_ROWS_PER_CHUNK = saved
                return call
            variants[f"slices of {slice_rows} rows ({megabytes} MB), no weight"] = sliced
        for round_name in ("r1", "r2"):
            for variant, make_call in variants.items():
                try:
                    us = time_graphs(make_call)
                except Exception as error:  # report and go on: one failure is still a result
                    print(f"{round_name} {name} {variant}: failed: {error!r}", flush=True)
                    continue
                gbps = 10 * shape.rows * shape.d / (us * 1e-6) / 1e9
                records.append(dict(round=round_name, shape=name, rows=shape.rows, d=shape.d,
                                    variant=variant, median_us=us, gbps=gbps))
                print(f"{round_name} {name:8s} {variant:42s} {us:7.1f} us {gbps:6.0f} GB/s",
                      flush=True)
    path = os.path.join(os.environ.get("OUT", "."), "long-row-l2-reuse.json")
    with open(path, "w") as handle:
        json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                       records=records), handle, indent=1)


if __name__ == "__main__":
    main()
