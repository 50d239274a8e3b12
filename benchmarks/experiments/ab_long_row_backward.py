"""Experiment (docs/perf-notes.md, variant 28): the backward of groups wider than a tile,
split into two tile launches (row dot products, then dx / dgate), against the looped
one-program-per-row kernel it replaces, timed as the benchmark times (cold L2).

``--before PATH`` is the backward.py that still has ``backward_long_row_kernel`` (the tree
before variant 28: ``git show 9e12127:gatednorm/kernels/backward.py``); it runs with its
shipped launch (4096 x 16 warps, 3 stages, zero-filled partials). Every split tile in
``--tiles`` runs through ``gatednorm.kernels.launch.backward``. dgate must equal the looped
kernel's bits (it does not depend on the row's dot product); dx and dweight are compared
with it (the dot product is summed in another order) and with fp64.

    git show 9e12127:gatednorm/kernels/backward.py > .dev/backward_head.py
    python benchmarks/experiments/ab_long_row_backward.py --before .dev/backward_head.py
    # on a CUDA machine; writes $OUT/ab-long-row-backward.json
"""

from __future__ import annotations

import argparse
import importlib.util
import os

import torch
import triton

from ab_common import cold_input_sets, new_result, save
from gatednorm.bench import timing
from gatednorm.bench.cases import sweep_case
from gatednorm.kernels import config, launch
from gatednorm.kernels.config import LaunchConfig
from gatednorm.kernels.layout import row_layout
from gatednorm import reference

BEFORE_LONG_ROW = LaunchConfig(1, 4096, 16, True, 3)
DEFAULT_TILES = "1x4096x8x4,1x4096x8x3,1x4096x16x3,1x2048x4x3,1x2048x8x3,2x2048x8x3,1x1024x4x3"
CASES = {case.name: case for case in (
    [sweep_case(d, dtype) for dtype in (torch.bfloat16, torch.float16, torch.float32)
     for d in (16384, 32768)])}


def _module_of(path: str):
    spec = importlib.util.spec_from_file_location("backward_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _parse_tiles(text: str) -> list[LaunchConfig]:
    tiles = []
    for item in filter(None, text.split(",")):
        rows, block_n, warps, stages = (int(v) for v in item.split("x"))
        tiles.append(LaunchConfig(rows, block_n, warps, True, stages))
    return tiles


def before_backward(module, a, rstd, options):
    """The looped kernel of ``module`` launched as its tree launched it."""
    x, gate, weight, dy = a
    d = x.shape[-1]
    group_size = options["group_size"]
    num_groups = d // group_size
    dx, dgate = torch.empty_like(x), torch.empty_like(gate)
    dweight = torch.empty_like(weight)
    layout = row_layout([x, gate, dy, dx, dgate], group_size)
    rows_per_chunk, num_chunks = config.backward_chunking(
        layout.rows, num_groups, 1, config.BACKWARD_TARGET_PROGRAMS)
    blocks = triton.cdiv(num_chunks, launch.DWEIGHT_BLOCK_CHUNKS)
    scratch = torch.zeros(((num_chunks + blocks) * d,), dtype=torch.float32, device=x.device)
    meta = launch._meta(layout, BEFORE_LONG_ROW, x.dtype, weight, options["zero_centered_gamma"],
                        options["activation"], options["norm_before_gate"],
                        options["rounding"])
    module.backward_long_row_kernel[(num_chunks * num_groups,)](
        x, gate, weight, dy, rstd, dx, dgate, scratch, *launch._layout_args(layout),
        group_size, num_groups, rows_per_chunk, d, **meta)
    launch._reduce_partials(scratch, dweight, num_chunks, blocks, d, None)
    return dx, dgate, dweight


def _fp64_grads(a, options):
    x, gate, weight, dy = (t.double().requires_grad_(t is not a[3]) for t in a)
    y = reference.fp32(x, gate, weight, eps=1e-6, group_size=options["group_size"],
                       norm_before_gate=options["norm_before_gate"],
                       activation=options["activation"])
    return torch.autograd.grad(y, (x, gate, weight), dy)


def _rel_err(value, truth):
    return float((value.double() - truth).abs().max() / truth.abs().max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="backward.py with the looped kernel")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    parser.add_argument("--tiles", default=DEFAULT_TILES,
                        help="split tiles, rows x block_n x warps x stages, comma-separated")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."),
                                                      "ab-long-row-backward.json"))
    args = parser.parse_args()
    before = _module_of(args.before)
    tiles = _parse_tiles(args.tiles)
    device, result = new_result(
        "python benchmarks/experiments/ab_long_row_backward.py "
        f"--before {args.before} --cases {args.cases} --tiles {args.tiles}")
    records, copy_gbps = result["records"], result["copy_gbps"]

    for name in args.cases.split(","):
        case = CASES[name]
        data = cold_input_sets(case, device)
        options = dict(zero_centered_gamma=False, activation=case.activation,
                       norm_before_gate=case.norm_before_gate, group_size=case.group,
                       rounding="te")
        launch._PLANS.clear()
        rstds = [launch.forward(*a[:3], eps=1e-6, traceable=False, **options)[1] for a in data]
        truth = _fp64_grads(data[0], options)
        reference = before_backward(before, data[0], rstds[0], options)

        def split_backward(a, rstd):
            return launch.backward(a[3], *a[:3], rstd, traceable=False, **options)

        trials = [("before 1x4096x16x3 looped", lambda a, r: before_backward(before, a, r,
                                                                             options), None)]
        trials += [(f"split {t.block_rows}x{t.block_n}x{t.num_warps}x{t.loop_stages}",
                    split_backward, t) for t in tiles]
        for round_ in range(1, args.rounds + 1):
            for label, call, tile in trials:
                launch.backward_config = (config.backward_config if tile is None
                                          else (lambda group_size, t=tile: t))
                launch._PLANS.clear()
                try:
                    dx, dgate, dweight = call(data[0], rstds[0])
                    ms = timing.measure([lambda a=a, r=r: call(a, r)
                                         for a, r in zip(data, rstds)], device,
                                        timing.FULL).median_ms
                except Exception as error:  # a tile that does not compile is reported
                    print(f"{name} {label} failed: {error!r}"[:400], flush=True)
                    continue
                frac = case.bytes_moved("bwd") / 1e9 / (ms * 1e-3) / copy_gbps
                record = dict(
                    case=name, variant=label, round=round_, median_ms=ms, frac_copy=frac,
                    dgate_same_bits=bool(torch.equal(dgate, reference[1])),
                    dx_rel_err_vs_before=_rel_err(dx, reference[0].double()),
                    dx_rel_err_vs_fp64=_rel_err(dx, truth[0]),
                    dgate_rel_err_vs_fp64=_rel_err(dgate, truth[1]),
                    dweight_rel_err_vs_fp64=_rel_err(dweight, truth[2]))
                records.append(record)
                print(f"{name:28s} r{round_} {label:28s} {ms * 1e3:8.1f} us "
                      f"{frac * 100:5.1f} % dgate bits {record['dgate_same_bits']} "
                      f"dx {record['dx_rel_err_vs_fp64']:.1e} "
                      f"dw {record['dweight_rel_err_vs_fp64']:.1e}", flush=True)
        launch.backward_config = config.backward_config
        del data, rstds
        save(result, args.out)


if __name__ == "__main__":
    main()
