"""Forward tile candidates at decode sizes (1..4096 tokens x 32 heads x 128, bf16), timed the
way the benchmark times decode in a CUDA graph: one replay holds GRAPH_CALLS forwards, and
the time per forward is the replay time over GRAPH_CALLS. torch.compile of the transformers
formula is timed the same way for reference.

    python benchmarks/decode_sweep.py [--tiles 16x4,8x2,4x1,2x1,1x1] [--out F]

Only the forward tile changes (the library's decode-tile rule is turned off so that each
candidate runs as given); everything else is the eager path of ``rms_norm_gated``. The first
run (decode-sweep-v1) chose config.FORWARD_FEW_PROGRAMS and FEW_ROWS_TILE_ELEMENTS.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys

import torch
import triton

import gatednorm
from gatednorm.bench import timing
from gatednorm.bench.providers import transformers_formula
from gatednorm.kernels import config as config_module
from gatednorm.kernels import launch
from gatednorm.kernels.config import LaunchConfig

HEADS, HEAD_DIM = 32, 128
TOKENS = (1, 4, 16, 64, 256, 1024, 4096)
CALLS, TRIALS = 200, 5


def graph_us(call) -> float:
    replay = timing.capture_graph(call, timing.GRAPH_CALLS)
    return timing.per_call_us(replay, torch.device("cuda"), CALLS, TRIALS) / timing.GRAPH_CALLS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiles", default="32x4,16x4,16x2,8x2,8x1,4x1,2x1,1x1",
                        help="forward (block_rows x num_warps) candidates for width 128")
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."),
                                                      "decode-sweep.json"))
    args = parser.parse_args()
    tiles = [tuple(int(v) for v in t.split("x")) for t in args.tiles.split(",")]
    # Each candidate tile as given: the library's own decode-tile rule off.
    config_module.FORWARD_FEW_PROGRAMS = 0
    compiled = torch.compile(transformers_formula, dynamic=False)
    records = []
    with torch.no_grad():
        for tokens in TOKENS:
            x = torch.randn(tokens, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
            gate = torch.randn_like(x)
            weight = torch.randn(HEAD_DIM, device="cuda", dtype=torch.bfloat16)
            reference = compiled(x, gate, weight, eps=1e-6, activation="silu",
                                 norm_before_gate=True, group_size=None)
            us = graph_us(lambda: compiled(x, gate, weight, eps=1e-6, activation="silu",
                                           norm_before_gate=True, group_size=None))
            records.append(dict(provider="hf-compile", tokens=tokens, rows=tokens * HEADS,
                                us_per_call=us))
            print(f"{tokens:5d} tokens  hf-compile        {us:6.2f} us", flush=True)
            for rows, warps in tiles:
                launch.forward_config = (
                    lambda group_size, r=rows, w=warps: LaunchConfig(r, 128, w, False))
                launch._PLANS.clear()
                y = gatednorm.rms_norm_gated(x, gate, weight)
                error = (y.float() - reference.float()).abs().max().item()
                us = graph_us(lambda: gatednorm.rms_norm_gated(x, gate, weight))
                records.append(dict(provider="gatednorm", tokens=tokens, rows=tokens * HEADS,
                                    block_rows=rows, num_warps=warps, us_per_call=us,
                                    max_abs_diff_vs_compile=error))
                print(f"{tokens:5d} tokens  tile {rows:2d} x {warps} warps  {us:6.2f} us"
                      f"  (max |y - compiled| {error:.3g})", flush=True)
            launch.forward_config = config_module.forward_config
            launch._PLANS.clear()
            with open(args.out, "w") as handle:
                json.dump(dict(
                    gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                    triton=triton.__version__, python=platform.python_version(),
                    date=datetime.date.today().isoformat(),
                    command="python benchmarks/decode_sweep.py " + " ".join(sys.argv[1:]),
                    method=f"CUDA graph of {timing.GRAPH_CALLS} forwards, host wall clock of "
                           f"{CALLS} replays, median of {TRIALS} trials, per forward",
                    records=records), handle, indent=1)


if __name__ == "__main__":
    main()
