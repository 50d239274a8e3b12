"""Experiment (docs/perf-notes.md, variants 34-37): the whole eager backward (main kernel, its
dweight reduction launches and the gaps between them) under variants of the launch plumbing
and of the kernel source, timed as the benchmark times (L2-cold, one call at a time).

Variants:
- ``no pdl``: every launch in plain stream order (config.BACKWARD_PROGRAMMATIC_LAUNCH off).
- ``pdl at exit``: programmatic dependent launch; each launch's successor may start once its
  programs exit, and waits for its writes (griddepcontrol.wait).
- ``pdl early``: the same, each launch letting its successor start at its own start.
- ``unmasked dweight``: backward.py with the dweight sum's mask select removed (variant 34,
  not shipped: the edit lives here), with and without pdl.
- ``reverse pass 2`` (long rows only): the second split launch walks its programs from the
  last, so its first tiles find in L2 what the first launch read last.

Every variant's dx, dgate and dweight are compared bit for bit with the ``no pdl`` launch of
the shipped source.

    python benchmarks/experiments/ab_backward_variants.py   # on a CUDA machine;
    # writes $OUT/ab-backward-variants.json
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import tempfile

import torch

from ab_common import cold_input_sets, new_result, save
from gatednorm.bench import timing
from gatednorm.bench.cases import gate_first_case, head_case, sweep_case
from gatednorm.kernels import backward as shipped_backward
from gatednorm.kernels import config, launch

bf16, fp16 = torch.bfloat16, torch.float16
CASES = {case.name: case for case in [
    head_case(4096, 32, bf16, "contiguous"),
    head_case(8192, 32, bf16, "contiguous"),
    head_case(8192, 32, bf16, "proj"),
    head_case(8192, 64, bf16, "contiguous"),
    head_case(65536, 32, bf16, "contiguous"),
    head_case(8192, 32, fp16, "contiguous"),
    head_case(4096, 96, bf16, "contiguous", "sigmoid"),
    gate_first_case("mamba2", 8192, 5120, 640, bf16, "contiguous"),
    gate_first_case("nemotronh", 8192, 8192, 1024, bf16, "contiguous"),
    sweep_case(256, bf16),
    sweep_case(1024, bf16),
    sweep_case(4096, bf16),
    sweep_case(8192, bf16),
    sweep_case(16384, bf16),
    sweep_case(32768, bf16),
    sweep_case(16384, fp16),
]}

UNMASKED_DWEIGHT = [("dweight += tl.sum(tl.where(mask, dweight_term, 0.0), axis=0)",
                     "dweight += tl.sum(dweight_term, axis=0)")]
REVERSE_PASS_2 = [("""    pid = tl.program_id(0)
    column_block = pid % column_blocks""", """    pid = tl.program_id(0)
    if SPLIT_PASS == INPUT_GRADS_PASS:
        pid = tl.num_programs(0) - 1 - pid
    column_block = pid % column_blocks""")]


def source_variant(tag: str, edits: list[tuple[str, str]]):
    """backward.py with ``edits`` applied, loaded as a module of its own (a real file, which
    Triton's jit needs for the source)."""
    source = pathlib.Path(shipped_backward.__file__).read_text()
    for old, new in edits:
        assert source.count(old) == 1, f"{tag}: edit target not found once: {old!r}"
        source = source.replace(old, new)
    path = pathlib.Path(tempfile.mkdtemp()) / f"backward_{tag}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"gatednorm.kernels.backward_{tag}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def use(module, pdl: bool, early: bool) -> None:
    launch.backward_tile_kernel = module.backward_tile_kernel
    launch.dweight_reduce_kernel = module.dweight_reduce_kernel
    config.BACKWARD_PROGRAMMATIC_LAUNCH = pdl
    config.BACKWARD_EARLY_DEPENDENTS = early
    launch._PLANS.clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."),
                                                      "ab-backward-variants.json"))
    args = parser.parse_args()
    shipped_flags = (config.BACKWARD_PROGRAMMATIC_LAUNCH, config.BACKWARD_EARLY_DEPENDENTS)
    unmasked = source_variant("unmasked", UNMASKED_DWEIGHT)
    reverse = source_variant("reverse", REVERSE_PASS_2)
    variants = [
        ("no pdl", shipped_backward, False, False, False),
        ("pdl at exit", shipped_backward, True, False, False),
        ("pdl early", shipped_backward, True, True, False),
        ("unmasked dweight, no pdl", unmasked, False, False, False),
        ("unmasked dweight, pdl early", unmasked, True, True, False),
        ("reverse pass 2, pdl early", reverse, True, True, True),
    ]
    device, result = new_result("python benchmarks/experiments/ab_backward_variants.py "
                                f"--cases {args.cases} --rounds {args.rounds}")
    records, copy_gbps = result["records"], result["copy_gbps"]
    for name in args.cases.split(","):
        case = CASES[name]
        long_row = case.group > 8192
        data = cold_input_sets(case, device)
        options = dict(zero_centered_gamma=False, activation=case.activation,
                       norm_before_gate=case.norm_before_gate, group_size=case.group,
                       rounding="te", traceable=False)
        use(shipped_backward, False, False)
        rstds = [launch.forward(*a[:3], eps=1e-6, **options)[1] for a in data]

        def backward(a, rstd):
            return launch.backward(a[3], *a[:3], rstd, **options)

        reference = backward(data[0], rstds[0])
        for round_ in range(1, args.rounds + 1):
            for label, module, pdl, early, long_rows_only in variants:
                if long_rows_only and not long_row:
                    continue
                use(module, pdl, early)
                out = backward(data[0], rstds[0])
                same = [bool(torch.equal(a, b)) for a, b in zip(out, reference)]
                ms = timing.measure([lambda a=a, r=r: backward(a, r)
                                     for a, r in zip(data, rstds)], device,
                                    timing.FULL).median_ms
                frac = case.bytes_moved("bwd") / 1e9 / (ms * 1e-3) / copy_gbps
                records.append(dict(case=name, variant=label, round=round_, median_ms=ms,
                                    frac_copy=frac, same_bits_dx_dgate_dweight=same))
                print(f"{name:34s} r{round_} {label:30s} {ms * 1e3:8.1f} us {frac * 100:5.1f} %"
                      f" same bits {same}", flush=True)
        use(shipped_backward, *shipped_flags)
        del data, rstds
        save(result, args.out)


if __name__ == "__main__":
    main()
