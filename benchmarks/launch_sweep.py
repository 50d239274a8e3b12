"""Sweep launch configurations on a GPU: kernel time by CUDA-graph replay, registers, spills.

Run from the repository root on a CUDA machine::

    python benchmarks/launch_sweep.py [--passes fwd,bwd] [--shapes d128,d1024,...] [--out F]
        [--timer graph|cold] [--dtype bf16|fp16] [--gate contiguous|proj]

For each shape it times every candidate configuration of the forward and/or the backward
(backward = the main kernel plus the two dweight reduction launches, as a user's backward
runs) and writes one record per candidate to a JSON file (rewritten after every shape).
``--timer graph`` (default) replays a CUDA graph of back-to-back calls
(``triton.testing.do_bench_cudagraph``) on tensors much larger than the L2; ``--timer cold``
times single calls the way ``python -m gatednorm.bench`` does (gatednorm.bench.timing.measure:
a spin kernel before each call, inputs rotated so the L2 is cold), which includes each launch's
ramp-up and last-wave tail that back-to-back replays overlap. It replaces
gatednorm's config functions for the duration of the sweep; the table in
gatednorm/kernels/config.py is read off its output (see docs/perf-notes.md).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, replace

import torch
import triton
from triton.testing import do_bench, do_bench_cudagraph

from gatednorm.bench import timing as bench_timing

from gatednorm.kernels import backward as backward_kernels
from gatednorm.kernels import config as config_module
from gatednorm.kernels import forward as forward_kernels
from gatednorm.kernels import launch
from gatednorm.kernels.config import LaunchConfig


@dataclass(frozen=True)
class Shape:
    name: str
    rows: int
    d: int
    group_size: int
    norm_before_gate: bool


SHAPES = {
    # GDN heads (rows = tokens x heads), 2^26 elements.
    "d128": Shape("d128", 1 << 19, 128, 128, True),
    # The benchmark's GDN 4096 tokens x 32 heads and its D=64 / D=1024 sweep points.
    "gdn4096x32": Shape("gdn4096x32", 1 << 17, 128, 128, True),
    "d64": Shape("d64", 786432, 64, 64, True),
    "d32": Shape("d32", 1572864, 32, 32, True),
    "d1024": Shape("d1024", 49152, 1024, 1024, True),
    # Mamba2 8192 x 5120, groups of 640, gate first.
    "mamba2": Shape("mamba2", 8192, 5120, 640, False),
    # Nemotron-H 8192 x 8192, groups of 1024, gate first.
    "nemotronh": Shape("nemotronh", 8192, 8192, 1024, False),
    # GDN 8192 tokens x 32 heads: half the size, where the last wave's tail shows more.
    "gdn8192x32": Shape("gdn8192x32", 1 << 18, 128, 128, True),
    "d96": Shape("d96", 1 << 19, 96, 96, True),
    "d192": Shape("d192", 1 << 18, 192, 192, True),
    "d256": Shape("d256", 1 << 18, 256, 256, True),
    "d512": Shape("d512", 1 << 17, 512, 512, True),
    "d2048": Shape("d2048", 1 << 15, 2048, 2048, True),
    "d4096": Shape("d4096", 16384, 4096, 4096, True),
    "d8192": Shape("d8192", 8192, 8192, 8192, True),
    "d16384": Shape("d16384", 4096, 16384, 16384, True),
    "d32768": Shape("d32768", 2048, 32768, 32768, True),
    # The wide and long rows at the benchmark's row counts (SWEEP_ELEMENTS // D): d2048,
    # d4096 and d8192 above hold a third more rows, where chunking differs.
    "d2048-24576r": Shape("d2048-24576r", 24576, 2048, 2048, True),
    "d4096-12288r": Shape("d4096-12288r", 12288, 4096, 4096, True),
    "d8192-6144r": Shape("d8192-6144r", 6144, 8192, 8192, True),
    "d16384-3072r": Shape("d16384-3072r", 3072, 16384, 16384, True),
    "d32768-1536r": Shape("d32768-1536r", 1536, 32768, 32768, True),
    # The 2048 tile gate first (variant 52 chose its warps and count norm first).
    "d2048gf-24576r": Shape("d2048gf-24576r", 24576, 2048, 2048, False),
    # Groups filling part of the 2048 tile, both orders.
    "d1536-32768r": Shape("d1536-32768r", 32768, 1536, 1536, True),
    "d1536gf-32768r": Shape("d1536gf-32768r", 32768, 1536, 1536, False),
    # The gate-first grouped shapes at 4096 tokens: whether their tiles' program counts
    # (chosen at 8192 tokens) hold at another row count.
    "nemotronh4096": Shape("nemotronh4096", 4096, 8192, 1024, False),
    "mamba2x4096": Shape("mamba2x4096", 4096, 5120, 640, False),
    # The D = 64 and 256 sweep points at a quarter of their rows: whether a tile chosen at the
    # benchmark's size holds at another.
    "d64-196608r": Shape("d64-196608r", 196608, 64, 64, True),
    "d256-49152r": Shape("d256-49152r", 49152, 256, 256, True),
    "d64-262144r": Shape("d64-262144r", 262144, 64, 64, True),
    "d32-393216r": Shape("d32-393216r", 393216, 32, 32, True),
    # D = 64 and 32 at more row counts (variant 48: the four-row tile's one win was the
    # program count's).
    "d64-393216r": Shape("d64-393216r", 393216, 64, 64, True),
    "d64-524288r": Shape("d64-524288r", 524288, 64, 64, True),
    "d64-1048576r": Shape("d64-1048576r", 1048576, 64, 64, True),
    "d64-1572864r": Shape("d64-1572864r", 1572864, 64, 64, True),
    "d32-786432r": Shape("d32-786432r", 786432, 32, 32, True),
    "d32-3145728r": Shape("d32-3145728r", 3145728, 32, 32, True),
    # GDN at 65536 tokens x 32 heads and Kimi's 4096 x 96 rows (program counts, variant 48).
    "gdn65536x32": Shape("gdn65536x32", 1 << 21, 128, 128, True),
    "kimi4096x96": Shape("kimi4096x96", 393216, 128, 128, True),
    # A group that fills part of the 256 tile without a head + tail split (224 = 256 - 32).
    "d224": Shape("d224", 1 << 18, 224, 224, True),
}

# Candidate (block_rows, num_warps) per power-of-two tile width, and long-row candidates
# (block_n, num_warps) for groups wider than the widest tile.
FORWARD_TILES = {
    128: [(16, 4), (8, 2), (32, 8)],
    256: [(8, 4), (4, 2)],
    512: [(4, 4), (2, 2)],
    1024: [(1, 2), (1, 1), (2, 2), (4, 2), (4, 4), (8, 4), (8, 8), (2, 8)],
    2048: [(1, 4), (1, 2)],
    4096: [(1, 8), (1, 4)],
    8192: [(1, 8), (1, 16)],
    16384: [(2, 32), (1, 16)],
}
BACKWARD_TILES = {
    128: [(8, 1), (8, 2), (4, 1), (16, 2), (16, 4)],
    256: [(4, 1), (4, 2), (8, 2)],
    512: [(2, 1), (2, 2), (4, 2)],
    1024: [(1, 2), (1, 4), (1, 8)],
    2048: [(1, 2), (1, 4), (1, 8)],
    4096: [(1, 4), (1, 8)],
    8192: [(1, 8), (1, 16)],
}
# Groups held as a head and a tail tile (config.head_and_tail), keyed by the padded width;
# (rows, warps, largest vector in elements or 0) as parse_tiles gives. Empty unless
# --forward-split / --backward-split ask.
FORWARD_SPLIT_TILES: dict[int, list[tuple[int, int, int]]] = {}
BACKWARD_SPLIT_TILES: dict[int, list[tuple[int, int, int]]] = {}
FORWARD_LONG_ROWS = [(2048, 8), (4096, 8), (4096, 16)]
# The backward's column blocks of a long row (one-row tiles, two launches).
BACKWARD_LONG_ROWS = [(1024, 4), (2048, 4), (2048, 8), (4096, 8)]


def parse_tiles(text: str) -> dict[int, list[tuple[int, int, int]]]:
    """``"128=4x1,8x1;1024=1x2v4"`` -> {128: [(4, 1, 0), (8, 1, 0)], 1024: [(1, 2, 4)]}: rows x
    warps, and after a ``v`` the largest vector in elements (LaunchConfig.max_vector_elements;
    0, the default: as the rows' alignment allows)."""
    tiles = {}
    for part in filter(None, text.split(";")):
        width, candidates = part.split("=")
        tiles[int(width)] = []
        for candidate in filter(None, candidates.split(",")):
            shape, _, vector = candidate.partition("v")
            rows, warps = (int(v) for v in shape.split("x"))
            tiles[int(width)].append((rows, warps, int(vector or 0)))
    return tiles


def _candidates(shape: Shape, tiles: dict, library_tiles: dict, long_rows: list,
                tile_stages, long_row_stages) -> list[LaunchConfig]:
    """Tiles wherever the sweep has candidates (--forward-tiles / --backward-tiles may add
    wider ones than the library's table), long rows wherever that table would use them."""
    block_n = triton.next_power_of_2(shape.group_size)
    # Table entries are (rows, warps), parsed ones (rows, warps, largest vector).
    candidates = [LaunchConfig(rows, block_n, warps, False, s,
                               max_vector_elements=vector[0] if vector else 0)
                  for rows, warps, *vector in tiles.get(block_n, []) for s in tile_stages]
    if block_n > max(library_tiles):
        candidates += [LaunchConfig(1, n, w, True, s) for n, w in long_rows
                       for s in long_row_stages]
    return candidates


def forward_candidates(shape: Shape, stages, tile_stages=(1,)) -> list[LaunchConfig]:
    """Tile candidates at each of ``tile_stages`` (1: the one-tile kernel; more: the row-loop
    kernel, prefetching that deep); long rows at each of ``stages``."""
    return (_candidates(shape, FORWARD_TILES, config_module.whole_widths(config_module.FORWARD), FORWARD_LONG_ROWS,
                        tile_stages, stages)
            + _split_candidates(shape, FORWARD_SPLIT_TILES, tile_stages))


def _split_candidates(shape: Shape, split_tiles: dict, stages) -> list[LaunchConfig]:
    split = config_module.head_and_tail(shape.group_size)
    if split is None:
        return []
    head, tail = split
    return [LaunchConfig(rows, head, warps, False, s, tail_n=tail, max_vector_elements=vector)
            for rows, warps, vector in split_tiles.get(2 * head, []) for s in stages]


def backward_candidates(shape: Shape, stages) -> list[LaunchConfig]:
    return (_candidates(shape, BACKWARD_TILES, config_module.whole_widths(config_module.BACKWARD),
                        BACKWARD_LONG_ROWS, stages, stages)
            + _split_candidates(shape, BACKWARD_SPLIT_TILES, stages))


def parse_long_rows(text: str) -> list[tuple[int, int]]:
    """``"4096x8,2048x4"`` -> [(4096, 8), (2048, 4)] (block_n x warps)."""
    return [tuple(int(v) for v in c.split("x")) for c in filter(None, text.split(","))]


def compiled_resources(kernel) -> dict:
    """Registers and spills of the most recently compiled variant of ``kernel``."""
    found = {}
    for cache in kernel.device_caches.values():
        for compiled in cache[0].values():
            found = dict(registers=compiled.n_regs, spills=compiled.n_spills,
                         shared_bytes=compiled.metadata.shared)
    return found


def forget_compiled(kernel) -> None:
    for cache in kernel.device_caches.values():
        cache[0].clear()


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Heads per token when --gate proj slices the gate from a [tokens, 3 * heads * d] projection.
PROJ_HEADS = 32


def make_inputs(shape: Shape, dtype: torch.dtype, gate_layout: str):
    """(x, gate, weight, dy) for ``shape``; with ``gate_layout`` "proj" the gate is the middle
    third of a projection output, as the benchmark's "proj" cases (row stride 3 x heads x d)."""
    x = torch.randn(shape.rows, shape.d, device="cuda", dtype=dtype)
    if gate_layout == "proj":
        tokens = shape.rows // PROJ_HEADS
        width = PROJ_HEADS * shape.d
        proj = torch.randn(tokens, 3 * width, device="cuda", dtype=dtype)
        gate = proj[:, width:2 * width].view(tokens, PROJ_HEADS, shape.d)
        x = x.view(tokens, PROJ_HEADS, shape.d)
    else:
        gate = torch.randn_like(x)
    weight = torch.randn(shape.d, device="cuda", dtype=dtype)
    return x, gate, weight, torch.randn_like(x)


def make_timer(kind: str, shape: Shape, dtype: torch.dtype, gate_layout: str, inputs):
    """time(call) -> median ms, where ``call(x, gate, weight, dy)`` runs one pass.

    graph: back-to-back replays of one input set. cold: single calls rotated over enough input
    sets to keep the L2 cold, as the benchmark measures."""
    if kind == "graph":
        def time_graph(call):
            return do_bench_cudagraph(lambda: call(*inputs), rep=30, return_mode="median")
        return time_graph
    set_bytes = 6 * shape.rows * shape.d * inputs[0].element_size()
    sets = max(bench_timing.MIN_SETS, -(-bench_timing.ROTATION_L2_MULTIPLE
                                       * bench_timing.l2_bytes(torch.device("cuda"))
                                       // set_bytes))
    all_inputs = [inputs] + [make_inputs(shape, dtype, gate_layout) for _ in range(sets - 1)]

    def time_cold(call):
        calls = [lambda i=i: call(*i) for i in all_inputs]
        return bench_timing.measure(calls, torch.device("cuda"), bench_timing.FULL).median_ms
    return time_cold


def sweep_shape(shape: Shape, passes: list[str], stages: list[int], targets: list[int],
                copy_gbps: float, options: dict, forward_stages=(1,),
                forward_targets=(1584,), min_rows_per_chunk=(None,), timer="graph",
                dtype=torch.bfloat16, gate_layout="contiguous",
                forward_store_rstd=True) -> list[dict]:
    inputs = make_inputs(shape, dtype, gate_layout)
    x, gate, weight, dy = inputs
    time_call = make_timer(timer, shape, dtype, gate_layout, inputs)
    elements = x.numel()
    common = dict(group_size=shape.group_size, norm_before_gate=shape.norm_before_gate,
                  traceable=False, **options)
    records = []

    def record(pass_name, config, target, ms, kernel, bytes_per_element, min_rows=None):
        gbps = bytes_per_element * elements / (ms * 1e-3) / 1e9
        entry = dict(shape=shape.name, dtype=str(dtype).removeprefix("torch."),
                     gate_layout=gate_layout, timer=timer, rows=shape.rows, d=shape.d, group_size=shape.group_size,
                     norm_before_gate=shape.norm_before_gate, pass_=pass_name,
                     config=asdict(config), target_programs=target,
                     min_rows_per_chunk=min_rows or config_module.MIN_ROWS_PER_CHUNK,
                     median_ms=ms, gbps=gbps,
                     frac_copy=gbps / copy_gbps, **compiled_resources(kernel))
        records.append(entry)
        print(f"{pass_name} {shape.name} rows={config.block_rows} n={config.block_n}"
              + (f"+{config.tail_n}" if config.tail_n else "")
              + (f" v{config.max_vector_elements}" if config.max_vector_elements else "") + " "
              f"w={config.num_warps} long={config.long_row} stages={config.loop_stages} "
              f"T={target} min_rows={entry['min_rows_per_chunk']} {ms * 1e3:.1f} us {entry['frac_copy'] * 100:.1f}% "
              f"regs={entry.get('registers')} spills={entry.get('spills')}", flush=True)

    if "fwd" in passes:
        saved_target = config_module.FORWARD_TARGET_PROGRAMS
        library_forward_config = config_module.forward_config
        for config in forward_candidates(shape, stages, forward_stages):
            if config.long_row:
                kernel = forward_kernels.forward_long_row_kernel
            elif config.loop_stages > 1:
                kernel = forward_kernels.forward_row_loop_kernel
            else:
                kernel = forward_kernels.forward_tile_kernel
            for target in (forward_targets if config.loop_stages > 1 and not config.long_row
                           else [None]):
                config_module.forward_config = lambda group_size, c=config: c
                if target is not None:
                    config_module.FORWARD_TARGET_PROGRAMS = target
                launch.clear_cache()
                try:
                    ms = time_call(lambda x, gate, weight, dy: launch.forward(
                        x, gate, weight, eps=1e-6, store_rstd=forward_store_rstd, **common))
                except Exception as error:  # a candidate that does not compile is reported
                    print("fwd failed", shape.name, config, repr(error)[:300], flush=True)
                    continue
                record("fwd", config, target, ms, kernel, 6)
            forget_compiled(kernel)
        config_module.forward_config = library_forward_config
        config_module.FORWARD_TARGET_PROGRAMS = saved_target

    if "bwd" in passes:
        saved_target = config_module.BACKWARD_TARGET_PROGRAMS
        library_backward_config = config_module.backward_config
        saved_min_rows = config_module.MIN_ROWS_PER_CHUNK
        launch.clear_cache()
        rstds = {}

        def rstd_of(x, gate, weight):
            # Computed once per input set, outside the timed calls (the plan cache is
            # cleared for each candidate, and the forward's plan is not swept here).
            if x.data_ptr() not in rstds:
                rstds[x.data_ptr()] = launch.forward(x, gate, weight, eps=1e-6, **common)[1]
            return rstds[x.data_ptr()]

        for config in backward_candidates(shape, stages):
            kernel = backward_kernels.backward_tile_kernel  # long rows: cut into its tiles
            for target, min_rows in itertools.product(targets, min_rows_per_chunk):
                config_module.backward_config = lambda group_size, c=config: c
                config_module.BACKWARD_TARGET_PROGRAMS = target
                config_module.MIN_ROWS_PER_CHUNK = min_rows or saved_min_rows
                launch.clear_cache()
                try:
                    ms = time_call(lambda x, gate, weight, dy: launch.backward(
                        dy, x, gate, weight, rstd_of(x, gate, weight), **common))
                except Exception as error:
                    print("bwd failed", shape.name, config, repr(error)[:300], flush=True)
                    continue
                # fit_shared_memory may have dropped the prefetch: record what ran.
                (plan,) = launch.cached_plans("bwd")
                ran = replace(config, loop_stages=plan.meta["LOOP_STAGES"])
                record("bwd", ran, target, ms, kernel, 10, min_rows)
            forget_compiled(kernel)
        config_module.backward_config = library_backward_config
        config_module.BACKWARD_TARGET_PROGRAMS = saved_target
        config_module.MIN_ROWS_PER_CHUNK = saved_min_rows
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", default="fwd,bwd")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--stages", default="1,2,3", help="loop pipelining depths to try")
    parser.add_argument("--targets", default="1056,4224",
                        help="backward program counts to try (BACKWARD_TARGET_PROGRAMS; the "
                             "swept tiles carry no per-tile count)")
    parser.add_argument("--forward-stages", default="1",
                        help="forward tile prefetch depths (1: one-tile kernel; more: row loop)")
    parser.add_argument("--forward-targets", default="1584",
                        help="program counts for the forward row loop "
                             "(FORWARD_TARGET_PROGRAMS; the swept tiles carry no per-tile count)")
    parser.add_argument("--forward-tiles", default="",
                        help='replace candidates per tile width, e.g. "128=16x4,8x2;1024=1x2"')
    parser.add_argument("--forward-split", default="",
                        help='forward candidates holding a group as head + tail tiles, by '
                             'padded width, e.g. "1024=1x1,2x2;128=16x4" (rows x warps)')
    parser.add_argument("--backward-split", default="",
                        help="backward candidates holding a group as head + tail tiles, as "
                             "--forward-split")
    parser.add_argument("--backward-tiles", default="",
                        help='replace candidates per tile width, e.g. "128=4x1,8x1"')
    parser.add_argument("--min-rows-per-chunk", default="",
                        help="backward MIN_ROWS_PER_CHUNK values to try (default: the table's)")
    parser.add_argument("--long-rows", default="",
                        help='replace long-row candidates (both passes), e.g. "4096x8,2048x4"')
    parser.add_argument("--timer", choices=("graph", "cold"), default="graph",
                        help="graph: CUDA-graph replay; cold: single calls as the benchmark")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--gate", choices=("contiguous", "proj"), default="contiguous",
                        help="proj: gate sliced from a [tokens, 3 x 32 x d] projection")
    parser.add_argument("--forward", choices=("training", "inference"), default="training",
                        help="training: the forward stores rstd (what the benchmark times; "
                             "files before 2026-12-02 22:30 UTC timed the inference forward)")
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."),
                                                      "launch-sweep.json"))
    args = parser.parse_args()
    FORWARD_TILES.update(parse_tiles(args.forward_tiles))
    BACKWARD_TILES.update(parse_tiles(args.backward_tiles))
    FORWARD_SPLIT_TILES.update(parse_tiles(args.forward_split))
    BACKWARD_SPLIT_TILES.update(parse_tiles(args.backward_split))
    if args.long_rows:
        FORWARD_LONG_ROWS[:] = BACKWARD_LONG_ROWS[:] = parse_long_rows(args.long_rows)
    min_rows = [int(v) for v in args.min_rows_per_chunk.split(",") if v] or [None]
    passes = args.passes.split(",")
    source = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    copy_gbps = 2 * source.numel() / (do_bench(lambda: target.copy_(source),
                                               return_mode="median") * 1e-3) / 1e9
    del source, target
    print(f"copy {copy_gbps:.0f} GB/s", flush=True)
    result = dict(
        gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
        python=platform.python_version(), date=datetime.date.today().isoformat(),
        command="python benchmarks/launch_sweep.py " + " ".join(sys.argv[1:]),
        method=(("kernel time by CUDA-graph replay (triton.testing.do_bench_cudagraph, median)"
                 if args.timer == "graph" else
                 "single calls as gatednorm.bench times them (spin kernel before each call, "
                 "inputs rotated, L2 cold; median)")
                + f", {args.dtype}, gate {args.gate}, rounding te, silu, weight in x's dtype; "
                f"{args.forward} forward; backward = main kernel + dweight reduction"),
        copy_gbps=copy_gbps, records=[])
    options = dict(zero_centered_gamma=False, activation="silu", rounding="te")
    for name in args.shapes.split(","):
        start = time.perf_counter()
        result["records"] += sweep_shape(
            SHAPES[name], passes, [int(v) for v in args.stages.split(",")],
            [int(v) for v in args.targets.split(",")], copy_gbps, options,
            [int(v) for v in args.forward_stages.split(",")],
            [int(v) for v in args.forward_targets.split(",")], min_rows, args.timer,
            DTYPES[args.dtype], args.gate, args.forward == "training")
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=1)
        print(f"{name} done in {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
