"""Experiment (variant 24 in docs/perf-notes.md): a stripped forward tile kernel for contiguous
D = 128 bf16 in variants (eviction hints, no row mask, gate loaded after the reduction, int32 row
index) beside the library's forward and FLA's, timed as the benchmark times (cold L2).

    python benchmarks/experiments/forward_variants.py   # CUDA; writes $OUT/fwd-variants.json
"""

import json
import os

import torch
import triton
import triton.language as tl

from gatednorm.bench import timing as bt
from gatednorm.kernels.pointwise import activation_and_slope, forward_output
from gatednorm.kernels import launch


@triton.jit
def fwd_variant(
    X,
    GATE,
    W,
    Y,
    rows,
    eps,
    BLOCK_ROWS: tl.constexpr,
    D: tl.constexpr,
    EVICT: tl.constexpr,
    MASK_ROWS: tl.constexpr,
    GATE_LATE: tl.constexpr,
    I64: tl.constexpr,
):
    pid = tl.program_id(0)
    if I64:
        rows_idx = pid.to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    else:
        rows_idx = pid * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, D)
    offs = rows_idx[:, None] * D + cols[None, :]
    mask = (rows_idx < rows)[:, None]
    if MASK_ROWS:
        if EVICT:
            x = tl.load(X + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(
                tl.float32
            )
        else:
            x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    else:
        if EVICT:
            x = tl.load(X + offs, eviction_policy="evict_first").to(tl.float32)
        else:
            x = tl.load(X + offs).to(tl.float32)
    if not GATE_LATE:
        if MASK_ROWS:
            g = tl.load(GATE + offs, mask=mask, other=0.0).to(tl.float32)
        else:
            g = tl.load(GATE + offs).to(tl.float32)
    gamma = tl.load(W + cols).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
    if GATE_LATE:
        if MASK_ROWS:
            g = tl.load(GATE + offs, mask=mask, other=0.0).to(tl.float32)
        else:
            g = tl.load(GATE + offs).to(tl.float32)
    act, _ = activation_and_slope(g, 0)
    y = forward_output(x * rstd[:, None], act, gamma, X.dtype.element_ty, False, True, True, 0)
    if MASK_ROWS:
        tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)
    else:
        tl.store(Y + offs, y.to(Y.dtype.element_ty))


def main():
    out = os.path.join(os.environ.get("OUT", "."), "fwd-variants.json")
    dev = torch.device("cuda")
    copy = bt.copy_bandwidth_gbps(dev, 1 << 30, bt.FULL)
    print(f"copy {copy:.0f}", flush=True)
    recs = []
    try:
        from fla.modules.norm.fused_norm_gate import (
            rms_norm_gated as fla_fn,
            layer_norm_gated_fwd_kernel,
        )
    except Exception as e:
        fla_fn = None
        print("no fla", e)
    for rows in (1 << 18, 1 << 19, 1 << 21):
        sets = max(2, -(-4 * 60 * 2**20 // (6 * rows * 128 * 2)))
        data = [
            (
                torch.randn(rows, 128, device=dev, dtype=torch.bfloat16),
                torch.randn(rows, 128, device=dev, dtype=torch.bfloat16),
                torch.randn(128, device=dev, dtype=torch.bfloat16),
            )
            for _ in range(sets)
        ]

        def rec(name, calls):
            ms = bt.measure(calls, dev, bt.FULL).median_ms
            frac = 6 * rows * 128 / 1e9 / (ms * 1e-3) / copy  # 6 bytes per element
            recs.append(dict(rows=rows, variant=name, median_ms=ms, frac_copy=frac))
            print(f"rows={rows} {name:40s} {ms*1e3:7.1f} us {frac*100:5.1f} %", flush=True)

        rec(
            "library",
            [
                lambda a=a: launch.forward(
                    a[0],
                    a[1],
                    a[2],
                    eps=1e-6,
                    zero_centered_gamma=False,
                    activation="silu",
                    norm_before_gate=True,
                    group_size=128,
                    rounding="te",
                    traceable=False,
                    store_rstd=False,
                )
                for a in data
            ],
        )
        if fla_fn is not None:
            rec(
                "fla",
                [
                    lambda a=a: fla_fn(a[0], a[1], a[2], None, activation="swish", eps=1e-6)
                    for a in data
                ],
            )
            try:
                print("fla best", layer_norm_gated_fwd_kernel.best_config, flush=True)
            except Exception as e:
                print(e)
        for br, nw in ((16, 4), (32, 4), (32, 8), (64, 8), (16, 8)):
            for evict, maskr, late, i64 in (
                (0, 1, 0, 1),
                (1, 1, 0, 1),
                (0, 0, 0, 1),
                (0, 1, 1, 1),
                (0, 1, 0, 0),
                (1, 0, 1, 0),
            ):
                ys = [torch.empty_like(a[0]) for a in data]
                grid = (triton.cdiv(rows, br),)
                name = f"{br}x{nw} evict{evict} maskrows{maskr} gatelate{late} i64{i64}"
                rec(
                    name,
                    [
                        lambda a=a, y=y: fwd_variant[grid](
                            a[0],
                            a[1],
                            a[2],
                            y,
                            rows,
                            1e-6,
                            BLOCK_ROWS=br,
                            D=128,
                            EVICT=evict,
                            MASK_ROWS=maskr,
                            GATE_LATE=late,
                            I64=i64,
                            num_warps=nw,
                        )
                        for a, y in zip(data, ys)
                    ],
                )
        json.dump(
            dict(
                copy_gbps=copy,
                torch=torch.__version__,
                triton=triton.__version__,
                gpu=torch.cuda.get_device_name(),
                records=recs,
            ),
            open(out, "w"),
            indent=1,
        )
        del data


main()
