"""Experiment (docs/perf-notes.md, variants 25 and 27, ab-8): specializations of the forward
kernels that the stripped kernel of ab-6 suggests, made by text edits of the forward.py from
before variant 27 (the shipped kernels now carry the winners as launch flags; time those with
ab_shared_offsets.py). Give that file with ``--source``::

    git show 5d1b08e:gatednorm/kernels/forward.py > .dev/forward_head.py

The edits:

- ``shared``: x, gate and y rows at the same offsets (a contiguous gate and x: one row offset
  instead of three; valid only when their strides are equal, which y's always are to x's);
- ``even``: the group fills its tile (group_size == BLOCK_N): no column mask;
- ``early``: rstd stored right after the reduction instead of after y;
- ``asm``: rstd stored by an inline-PTX ``st.global`` in the reduction's own layout: ``tl.store``
  of a 1-D tensor gets a fresh coalesced layout, and converting rstd into it goes through
  shared memory with two barriers (the TTGIR shows the ``convert_layout``);
- ``nostore``: no rstd store at all (the inference forward): the floor the others aim at.

    python benchmarks/experiments/ab_forward_specializations.py --source .dev/forward_head.py \
        --offline        # any machine, without TRITON_INTERPRET=1
    python benchmarks/experiments/ab_forward_specializations.py --source .dev/forward_head.py
                         # CUDA: time them

``--offline`` compiles each variant for sm_90 (Triton's ptxas, as instruction_count.py does)
and prints registers and SASS instructions for the training forward (rstd stored) of the GDN
tile (16 x 128, 4 warps). On a GPU each variant runs the training forward of the GDN shapes,
timed as the benchmark times (cold L2), after checking that y and rstd have the shipped
kernel's bits; results go to $OUT/ab-forward-specializations.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import tempfile

import torch
import triton

from gatednorm.kernels import forward as shipped

def _asm_store(indent: str, index: str) -> str:
    return (f'{indent}tl.inline_asm_elementwise("{{ .reg .pred p; setp.ne.b32 p, $3, 0; '
            f'@p st.global.b32 [$1], $2; mov.b32 $0, 0; }}", "=r,l,r,r", '
            f'[(RSTD + {index} * num_groups + group).to(tl.int64), rstd, '
            f'row_mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)\n')


# Each edit: (old, new) text pairs for the tile kernel (4-space body) and the row-loop kernel
# (8-space loop body); an edit changes whichever of them it finds.
TILE, LOOP = ("    ", "rows_idx.to(tl.int64)"), ("        ", "rows_idx")


def _store(indent, index):
    return f"{indent}    tl.store(RSTD + {index} * num_groups + group, rstd, mask=row_mask)\n"


def _y_store(indent):
    return (f"{indent}tl.store(Y + y_rows[:, None] + cols[None, :], y.to(Y.dtype.element_ty), "
            f"mask=mask)\n")


def _rstd_line(indent):
    return f"{indent}rstd = 1.0 / tl.sqrt(mean_square + eps)\n"


EDITS = {
    # y (and, when its strides equal x's, the gate) at x's row offsets
    "yx": [(f"{i}y_rows = tl.multiple_of(y_rows + group_offset, ROW_ALIGN)\n",
            f"{i}y_rows = x_rows\n") for i, _ in (TILE, LOOP)],
    "gx": [(f"{i}g_rows = tl.multiple_of(g_rows + group_offset, ROW_ALIGN)\n",
            f"{i}g_rows = x_rows\n") for i, _ in (TILE, LOOP)],
    "even": [("    col_mask = cols < group_size\n    mask = row_mask[:, None]",
              "    col_mask = cols < BLOCK_N\n    mask = row_mask[:, None]")],
    # rstd stored right after it is computed instead of after y
    "early": [pair for i, index in (TILE, LOOP) for pair in (
        (_y_store(i) + f"{i}if STORE_RSTD:\n" + _store(i, index), _y_store(i)),
        (_rstd_line(i), _rstd_line(i) + f"{i}if STORE_RSTD:\n" + _store(i, index)))],
    # rstd stored by inline PTX in the reduction's layout (no convert_layout)
    "asm": [(_store(i, index), _asm_store(i + "    ", index)) for i, index in (TILE, LOOP)],
}


# The forward.py the edits apply to (--source).
SOURCE = {"path": shipped.__file__}


def variant_kernels(names: tuple[str, ...]):
    """(tile kernel, row-loop kernel) of forward.py with the named edits applied."""
    source = open(SOURCE["path"]).read()
    for name in names:
        if name == "nostore":
            continue
        applied = 0
        for old, new in EDITS[name]:
            if old in source:
                source, applied = source.replace(old, new, 1), applied + 1
        assert applied, f"forward.py changed: edit {name!r} finds nothing"
    path = os.path.join(tempfile.mkdtemp(), "forward_" + "_".join(names or ("shipped",)) + ".py")
    with open(path, "w") as handle:
        handle.write(source)
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.forward_tile_kernel, module.forward_row_loop_kernel


def variant_kernel(names: tuple[str, ...]):
    return variant_kernels(names)[0]


# Variants timed on every case; "gx" only where the gate's strides equal x's (contiguous).
VARIANTS = [(), ("nostore",), ("early",), ("early", "asm"), ("yx",), ("yx", "early"),
            ("yx", "early", "asm"), ("yx", "asm"), ("yx", "nostore")]
SHARED_VARIANTS = [("yx", "gx"), ("yx", "gx", "early"), ("yx", "gx", "early", "asm"),
                   ("yx", "gx", "even", "early", "asm"), ("yx", "gx", "nostore")]


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
    for leading_dims, variants in ((1, VARIANTS + SHARED_VARIANTS), (2, VARIANTS)):
        print(f"LEADING_DIMS={leading_dims}")
        for names in variants:
            compiled = counter.compile_for_sm90(
                variant_kernel(names), pointers,
                dict(flags, LEADING_DIMS=leading_dims, STORE_RSTD="nostore" not in names), 4)
            lines, usage = counter.disassemble(compiled)
            counts = counter.opcode_counts(lines)
            print(f"  {'+'.join(names) or 'shipped':22s} {usage.split()[0]:8s} "
                  f"instructions {sum(counts.values()):4d}  barriers {counts['BAR']}")


# (name, x shape, group size, gate first, gate layout)
CASES = [
    ("gdn8192x32", (8192, 32, 128), 128, False, "contiguous"),
    ("gdn8192x64", (8192, 64, 128), 128, False, "contiguous"),
    ("gdn65536x32", (65536, 32, 128), 128, False, "contiguous"),
    ("gdn8192x32-proj", (8192, 32, 128), 128, False, "proj"),
    ("gdn65536x32-proj", (65536, 32, 128), 128, False, "proj"),
    ("mamba2-8192x5120-g640", (8192, 5120), 640, True, "contiguous"),
    ("d96-524288r", (524288, 96), 96, False, "contiguous"),
]


def on_gpu(out: str) -> None:
    from gatednorm.bench import timing
    from gatednorm.kernels import launch

    try:
        from fla.modules.norm.fused_norm_gate import rms_norm_gated as fla_fn
    except ImportError:
        fla_fn = None
    device = torch.device("cuda")
    copy_gbps = timing.copy_bandwidth_gbps(device, 1 << 30, timing.FULL)
    kernels = {names: variant_kernels(names) for names in VARIANTS + SHARED_VARIANTS}
    records = []
    for name, shape, group_size, gate_first, gate_layout in CASES:
        numel = torch.Size(shape).numel()
        sets = max(2, -(-4 * 60 * 2**20 // (6 * numel)))
        data = []
        for _ in range(sets):
            x = torch.randn(shape, device=device, dtype=torch.bfloat16)
            if gate_layout == "proj":
                width = numel // shape[0]
                gate = torch.randn(shape[0], 3 * width, device=device, dtype=torch.bfloat16)
                gate = gate[:, width:2 * width].view(shape)
            else:
                gate = torch.randn(shape, device=device, dtype=torch.bfloat16)
            data.append((x, gate, torch.randn(shape[-1], device=device, dtype=torch.bfloat16)))
        launch._PLANS.clear()
        reference, reference_rstd = launch.forward(
            *data[0], eps=1e-6, zero_centered_gamma=False, activation="silu",
            norm_before_gate=not gate_first, group_size=group_size, rounding="te",
            traceable=False)
        plan = next(p for key, p in launch._PLANS.items() if key[0] == "fwd")
        loop = plan.kernel.__name__ == "forward_row_loop_kernel" if hasattr(
            plan.kernel, "__name__") else "row_loop" in str(plan.kernel)
        trials = VARIANTS + (SHARED_VARIANTS if gate_layout == "contiguous" else [])
        if loop:
            trials = [names for names in trials if "even" not in names]
        if fla_fn is not None and not gate_first:
            trials = trials + [("fla",)]

        def calls_of(names):
            """(one call per input set, bits equal to the shipped kernel's or None)."""
            if names == ("fla",):
                return [lambda a=a: fla_fn(a[0], a[1], a[2], None, activation="swish", eps=1e-6)
                        for a in data], None
            kernel = kernels[names][1 if loop else 0]
            # The edited kernels predate variant 27's launch flags.
            meta = {key: value for key, value in plan.meta.items()
                    if key not in ("RSTD_BY_PTX", "GATE_ROWS_AS_X", "Y_ROWS_AS_X")}
            meta["STORE_RSTD"] = "nostore" not in names

            def call(inputs, poison=False):
                y = torch.empty_like(inputs[0])
                rstd = torch.empty(reference_rstd.shape, device=device)
                if poison:
                    y.fill_(float("nan"))
                    rstd.fill_(float("nan"))
                kernel[plan.grid](*inputs, y, rstd, *plan.layout_args, 1e-6, **meta)
                return y, rstd

            y, rstd = call(data[0], poison=True)
            same_bits = torch.equal(y, reference) and (
                "nostore" in names or torch.equal(rstd, reference_rstd))
            return [lambda inputs=inputs: call(inputs) for inputs in data], same_bits

        for round_ in (1, 2):
            for names in trials:
                label = "+".join(names) or "shipped"
                calls, same_bits = calls_of(names)
                ms = timing.measure(calls, device, timing.FULL).median_ms
                frac = 6 * numel / 1e9 / (ms * 1e-3) / copy_gbps
                records.append(dict(case=name, kernel="row_loop" if loop else "tile",
                                    variant=label, round=round_, median_ms=ms, frac_copy=frac,
                                    same_bits=same_bits))
                print(f"{name:22s} r{round_} {label:24s} {ms * 1e3:7.1f} us "
                      f"{frac * 100:5.1f} % same bits {same_bits}", flush=True)
        with open(out, "w") as handle:
            json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                           triton=triton.__version__, copy_gbps=copy_gbps, records=records),
                      handle, indent=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--offline", action="store_true")
    parser.add_argument("--source", default=shipped.__file__,
                        help="the forward.py to edit (the edits match the one of 5d1b08e)")
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."),
                                                      "ab-forward-specializations.json"))
    args = parser.parse_args()
    SOURCE["path"] = args.source
    if args.offline:
        offline()
    else:
        on_gpu(args.out)


if __name__ == "__main__":
    main()
