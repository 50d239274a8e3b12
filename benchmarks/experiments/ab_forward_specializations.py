"""Experiment (docs/perf-notes.md, after variant 25): specializations of the forward tile kernel
that the stripped kernel of ab-6 suggests, made from gatednorm/kernels/forward.py by text edits:

- ``shared``: x, gate and y rows at the same offsets (a contiguous gate and x: one row offset
  instead of three; valid only when their strides are equal, which y's always are to x's);
- ``even``: the group fills its tile (group_size == BLOCK_N): no column mask;
- ``early``: rstd stored right after the reduction instead of after y.

    python benchmarks/experiments/ab_forward_specializations.py --offline   # any machine,
                                                    # without TRITON_INTERPRET=1
    python benchmarks/experiments/ab_forward_specializations.py             # CUDA: time them

``--offline`` compiles each variant for sm_90 (Triton's ptxas, as instruction_count.py does)
and prints registers and SASS instructions for the training forward (rstd stored) of the GDN
tile (16 x 128, 4 warps). On a GPU each variant runs the training forward of the GDN shapes,
timed as the benchmark times (cold L2), after checking that y and rstd have the shipped
kernel's bits; results go to $OUT/ab-forward-specializations.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import tempfile

import torch

from gatednorm.kernels import forward as shipped

EDITS = {
    "shared": (
        "    y_rows = tl.multiple_of(y_rows + group_offset, ROW_ALIGN)\n",
        "    y_rows = tl.multiple_of(y_rows + group_offset, ROW_ALIGN)\n"
        "    g_rows = x_rows\n    y_rows = x_rows\n",
    ),
    "even": ("    col_mask = cols < group_size\n    mask = row_mask[:, None]",
             "    col_mask = cols < BLOCK_N\n    mask = row_mask[:, None]"),
}
LATE_STORE = ("    tl.store(Y + y_rows[:, None] + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)\n"
              "    if STORE_RSTD:\n"
              "        tl.store(RSTD + rows_idx.to(tl.int64) * num_groups + group, rstd, "
              "mask=row_mask)\n")
RSTD_LINE = "    rstd = 1.0 / tl.sqrt(mean_square + eps)\n    y = forward_output("


def _edit(source: str, old: str, new: str) -> str:
    assert source.count(old) >= 1, f"forward.py changed: cannot find {old!r}"
    return source.replace(old, new, 1)


def variant_kernel(names: tuple[str, ...]):
    """The forward tile kernel with the named edits applied."""
    source = open(shipped.__file__).read()
    for name in names:
        if name == "early":
            source = _edit(source, LATE_STORE, LATE_STORE.split("    if STORE_RSTD")[0])
            source = _edit(source, RSTD_LINE, (
                "    rstd = 1.0 / tl.sqrt(mean_square + eps)\n    if STORE_RSTD:\n"
                "        tl.store(RSTD + rows_idx.to(tl.int64) * num_groups + group, rstd, "
                "mask=row_mask)\n    y = forward_output("))
        else:
            source = _edit(source, *EDITS[name])
    path = os.path.join(tempfile.mkdtemp(), "forward_" + "_".join(names or ("shipped",)) + ".py")
    with open(path, "w") as handle:
        handle.write(source)
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.forward_tile_kernel


VARIANTS = [names for size in range(4) for names in itertools.combinations(
    ("shared", "even", "early"), size)]


def offline() -> None:
    os.environ["TRITON_INTERPRET"] = "0"
    spec = importlib.util.spec_from_file_location(
        "instruction_count", os.path.join(os.path.dirname(__file__), "..", "instruction_count.py"))
    counter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(counter)
    flags = dict(LEADING_DIMS=1, ROW_ALIGN=8, HAS_WEIGHT=True, ZERO_CENTERED=False, ACTIVATION=0,
                 NORM_BEFORE_GATE=True, ROUNDING=0, WEIGHT_PRODUCT_ROUNDED=False,
                 BLOCK_ROWS=16, BLOCK_N=128, STORE_RSTD=True)
    pointers = {name: "*bf16" for name in ("X", "GATE", "W", "Y")}
    pointers["RSTD"] = "*fp32"
    for names in VARIANTS:
        compiled = counter.compile_for_sm90(variant_kernel(names), pointers, flags, 4)
        lines, usage = counter.disassemble(compiled)
        counts = counter.opcode_counts(lines)
        print(f"{'+'.join(names) or 'shipped':20s} {usage.split()[0]:8s} "
              f"instructions {sum(counts.values()):4d}  barriers {counts['BAR']}")


def on_gpu(out: str) -> None:
    from gatednorm.bench import timing
    from gatednorm.kernels import launch

    device = torch.device("cuda")
    copy_gbps = timing.copy_bandwidth_gbps(device, 1 << 30, timing.FULL)
    records = []
    for name, tokens, heads in (("gdn8192x32", 8192, 32), ("gdn8192x64", 8192, 64),
                                ("gdn65536x32", 65536, 32)):
        rows = tokens * heads
        sets = max(2, -(-4 * 60 * 2**20 // (6 * rows * 128)))
        data = [(torch.randn(tokens, heads, 128, device=device, dtype=torch.bfloat16),
                 torch.randn(tokens, heads, 128, device=device, dtype=torch.bfloat16),
                 torch.randn(128, device=device, dtype=torch.bfloat16)) for _ in range(sets)]
        launch._PLANS.clear()
        reference, reference_rstd = launch.forward(
            *data[0], eps=1e-6, zero_centered_gamma=False, activation="silu",
            norm_before_gate=True, group_size=128, rounding="te", traceable=False)
        plan = next(p for key, p in launch._PLANS.items() if key[0] == "fwd")
        for names in VARIANTS:
            kernel = variant_kernel(names)

            def call(inputs, kernel=kernel):
                y = torch.empty_like(inputs[0])
                rstd = torch.empty(rows, device=device)
                kernel[plan.grid](*inputs, y, rstd, *plan.layout_args, 1e-6, **plan.meta)
                return y, rstd

            y, rstd = call(data[0])
            same_bits = torch.equal(y, reference) and torch.equal(rstd.view(-1),
                                                                   reference_rstd.view(-1))
            ms = timing.measure([lambda inputs=inputs: call(inputs) for inputs in data], device,
                                timing.FULL).median_ms
            frac = 6 * rows * 128 / 1e9 / (ms * 1e-3) / copy_gbps
            records.append(dict(case=name, variant="+".join(names) or "shipped", median_ms=ms,
                                frac_copy=frac, same_bits=same_bits))
            print(f"{name:12s} {'+'.join(names) or 'shipped':20s} {ms * 1e3:7.1f} us "
                  f"{frac * 100:5.1f} % same bits {same_bits}", flush=True)
        with open(out, "w") as handle:
            json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                           copy_gbps=copy_gbps, records=records), handle, indent=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--offline", action="store_true")
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."),
                                                      "ab-forward-specializations.json"))
    args = parser.parse_args()
    if args.offline:
        offline()
    else:
        on_gpu(args.out)


if __name__ == "__main__":
    main()
