"""python -m gatednorm.bench: check and time gatednorm against its peers; JSON, table and plot.

    python -m gatednorm.bench                       # full run (about 6 min on an H200)
    python -m gatednorm.bench --cases bf16 --all-peers   # some cases, every peer on each
    python -m gatednorm.bench --quick               # a third of the cases, fewer repetitions
    python -m gatednorm.bench --smoke               # tiny shapes, every code path, runs on CPU
    python -m gatednorm.bench --cases head128,decode --providers gatednorm,fla --fresh-cache
    python -m gatednorm.bench --list                # the cases and providers, then exit

Where results go: a full or ``--cases`` run on a GPU that times every provider updates
``benchmarks/results/<gpu>.json`` (e.g. ``h200.json``; :mod:`gatednorm.bench.results`): the
cases it measured replace their earlier records, the others stay, and the plot beside it is
redrawn. ``--quick``, ``--smoke``, ``--providers`` and CPU runs write a file of their own
under the temporary directory; ``--out FILE`` writes this run alone to FILE. The path is
printed at the start and at the end.

For every case (gatednorm.bench.cases) the inputs are drawn once, in enough rotated sets to
keep the L2 cold, and the fp64 oracle is computed from the first set. Then, for every
provider (gatednorm.bench.providers) that can run the case: its first forward and first
backward are timed (compile and autotune included) and their outputs checked against the
oracle — a provider that fails the check is still timed but reported as "wrong", never as a
win — and then the passes are timed (gatednorm.bench.timing):

- ``fwd``: the training forward (inputs require grad, autograd records its graph);
- ``bwd``: ``torch.autograd.grad(y, (x, gate, weight), dy, retain_graph=True)`` through a
  graph recorded once per input set: each provider's whole backward and nothing else. If a
  provider cannot run its backward twice, bwd is reported as fwd+bwd minus fwd instead and
  ``bwd_method`` says so;
- ``fwd+bwd``: one forward and its backward per call.

Decode cases time the inference forward per call, eager (host overhead included) and inside
a CUDA graph (a graph of timing.GRAPH_CALLS forwards replayed, time per forward). A run stops starting new cases after ``--budget-s`` seconds; the cases
it did not reach are recorded as "skipped".
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import shlex
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch
import triton

import gatednorm
from gatednorm.bench import cases, providers, report, results, timing
from gatednorm.bench.measure import (Context, measure_decode, measure_same_bytes_copy,
                                      measure_training, not_runnable, placeholders, warm_triton)

# Full run on the H200: ~6 minutes of wall time in all; the case loop stops starting new
# cases after this many seconds (startup, the copy measurement and the report take the rest).
FULL_BUDGET_S = 330.0
COPY_BYTES_CUDA = 2**30
COPY_BYTES_CPU = 16 * 2**20


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m gatednorm.bench",
        description="Check and time gatednorm.rms_norm_gated against eager, compiled and "
                    "flash-linear-attention implementations.")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true",
                      help="a representative third of the cases, fewer repetitions")
    size.add_argument("--smoke", action="store_true",
                      help="tiny shapes covering every provider, case family and pass; runs on "
                           "CPU (set TRITON_INTERPRET=1 to run gatednorm's kernels there)")
    parser.add_argument("--cases", help="comma-separated substrings; keep cases whose name "
                                        "contains any of them")
    parser.add_argument("--providers", help="comma-separated provider names (default: all)")
    parser.add_argument("--out", type=Path,
                        help="write this run alone to this JSON file (default: a full or "
                             "--cases GPU run updates benchmarks/results/<gpu>.json, other runs "
                             "write under the temporary directory); the plot goes beside it")
    parser.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    parser.add_argument("--fresh-cache", action="store_true",
                        help="point TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR at new empty "
                             "directories, so first calls include the full compile")
    parser.add_argument("--budget-s", type=float,
                        help=f"stop starting new cases after this many seconds; 0: no limit "
                             f"(default {FULL_BUDGET_S:.0f} for a full run, none otherwise)")
    parser.add_argument("--all-peers", action="store_true",
                        help="time every provider on every case (the full run leaves "
                             "torch.compile and FLA out of the fp16/fp32 D sweeps)")
    parser.add_argument("--no-same-bytes-copy", action="store_true",
                        help="do not time, per training case and pass, a copy moving the "
                             "same bytes (what the case's size alone allows; on by default on a GPU "
                             "and with --smoke)")
    parser.add_argument("--rounding", default="te", choices=("te", "fp32", "hf"),
                        help="gatednorm's rounding convention (default te)")
    parser.add_argument("--compile-backend",
                        help="torch.compile backend (default inductor; aot_eager on CPU, "
                             "where Inductor would compile C++ for minutes)")
    parser.add_argument("--device", help="default: cuda if available, else cpu")
    parser.add_argument("--list", action="store_true", help="print cases and providers, exit")
    parser.add_argument("--quantized", action="store_true",
                        help="run the FP8-output benchmark instead (python -m "
                             "gatednorm.bench.quantized; its own options follow)")
    return parser.parse_args(argv)


def _fresh_cache_dirs() -> str:
    # In time: Triton and Inductor read these variables at each compile, not at import.
    root = tempfile.mkdtemp(prefix="gatednorm-bench-cache-")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(root, "triton")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(root, "inductor")
    return root


def _command(argv: list[str] | None) -> str:
    args = sys.argv[1:] if argv is None else argv
    return " ".join(["python", "-m", "gatednorm.bench", *map(shlex.quote, args)])


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_case(case, selected, ctx: Context) -> list[dict]:
    """Every selected provider on one case: placeholders for those that cannot run it."""
    by_provider: dict[str, list[dict]] = {}
    runnable = []
    for provider in selected:
        reason = not_runnable(provider, case, ctx)
        if reason is None:
            runnable.append(provider)
        else:
            by_provider[provider.name] = placeholders(provider.name, case, *reason)
    if runnable:
        n_sets = timing.rotation_sets(case, ctx.device, ctx.budget)
        sets = [case.make_inputs(ctx.device, seed=i) for i in range(n_sets)]
        truth = providers.oracle(case, sets[0], ctx.options)
        measure = measure_decode if case.is_decode else measure_training
    for provider in runnable:
        try:
            by_provider[provider.name] = measure(provider, case, sets, truth, ctx)
        except Exception as error:  # noqa: BLE001 - one provider's failure must not stop the run
            by_provider[provider.name] = placeholders(provider.name, case, "error",
                                                       f"{type(error).__name__}: {error}")
    if runnable:
        # The next case has other shapes: hand this one's blocks back to the allocator.
        del sets, truth
        gc.collect()
        if timing.is_cuda(ctx.device):
            torch.cuda.empty_cache()
    return [r for provider in selected for r in by_provider[provider.name]]


def _case_line(case, records: list[dict]) -> str:
    """One progress line: each provider's fwd and fwd+bwd ms (decode: eager and graph us)."""
    shown = ("eager", "graph") if case.is_decode else ("fwd", "fwd+bwd")
    unit = "us" if case.is_decode else "ms"
    parts = []
    for provider in dict.fromkeys(r["provider"] for r in records):
        mine = [r for r in records if r["provider"] == provider
                and (r.get("mode") if case.is_decode else r["pass"]) in shown]
        if not any(report.timed(r) for r in mine):
            parts.append(f"{provider} {mine[0]['status']}")
            continue
        values = [(f"{r['us_per_call']:.1f}{unit}" if case.is_decode
                   else f"{r['median_ms']:.3f}{unit}") if report.timed(r) else r["status"]
                  for r in mine]
        flag = " WRONG" if any(r["status"] == "wrong" for r in mine) else ""
        parts.append(f"{provider} {'/'.join(values)}{flag}")
    return f"{case.name} ({'/'.join(shown)}): " + ", ".join(parts)


def _skip_case(case, selected, ctx: Context, budget_s: float) -> list[dict]:
    """Placeholders for a case the run did not reach within its time budget."""
    records = []
    for provider in selected:
        reason = not_runnable(provider, case, ctx) or (
            "skipped", f"not reached within --budget-s {budget_s:.0f}")
        records += placeholders(provider.name, case, *reason)
    return records


def run_cases(case_list, selected, ctx: Context, budget_s: float | None,
              started: float, save_partial=None) -> list[dict]:
    """All cases in order, one progress line each; none is started after ``budget_s``.
    ``save_partial(records)`` runs after each case, so a run killed midway keeps its results."""
    records: list[dict] = []
    for i, case in enumerate(case_list, 1):
        elapsed = time.perf_counter() - started
        prefix = f"[{i}/{len(case_list)} {elapsed:5.0f}s]"
        if budget_s is not None and elapsed > budget_s:
            records += _skip_case(case, selected, ctx, budget_s)
            _progress(f"{prefix} {case.name}: skipped (--budget-s)")
            continue
        case_records = run_case(case, selected, ctx)
        records += case_records
        if ctx.same_bytes_copy and not case.is_decode:
            ctx.same_bytes_copies.extend(measure_same_bytes_copy(case, ctx))
        _progress(f"{prefix} {_case_line(case, case_records)}")
        if save_partial is not None:
            save_partial(records)
        for r in case_records:
            if r["status"] == "error" and r.get("mode") in (None, "eager") \
                    and r["pass"] == "fwd":
                _progress(f"    {r['provider']} error: {r['error'][:300]}")
    return records


def _print_list(case_list, selected) -> None:
    for case in case_list:
        print(f"{case.name:<44} {case.family:<10} rows={case.rows:<8} d={case.d:<6} "
              f"group={case.group:<6} fwd {case.bytes_moved('fwd') / 1e6:8.1f} MB"
              f"{'  providers: ' + ','.join(case.providers) if case.providers else ''}")
    for provider in selected:
        missing = provider.missing()
        print(f"{provider.name:<15} {provider.description}"
              f"{'  [' + missing + ']' if missing else ''}")


def _subject_path(device: torch.device) -> str:
    """What gatednorm runs on this device."""
    if timing.is_cuda(device):
        return "Triton kernels"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "Triton kernels through Triton's interpreter"
    return "its eager reference composite (CPU tensors without TRITON_INTERPRET=1)"


def _start_message(mode, gpu, device, case_list, selected, ctx, out, out_why) -> str:
    lines = [f"gatednorm bench ({mode}): {gpu}, {len(case_list)} cases, providers "
             f"{', '.join(p.name for p in selected)}"]
    lines.append(f"gatednorm runs {_subject_path(device)}")
    if timing.is_cuda(device):
        lines.append(f"copy bandwidth {ctx.copy_gbps:.0f} GB/s (read + write)")
    else:
        lines.append("CPU: wall-clock times of tiny shapes, which show that every code path "
                     "runs; no bandwidth figures" + ("" if os.environ.get("TRITON_INTERPRET")
                                                     == "1" else "; set TRITON_INTERPRET=1 to "
                                                     "run gatednorm's kernels instead"))
    lines += [f"{p.name}: {p.missing()}" for p in selected if p.missing()]
    lines.append(f"results: {out} ({out_why})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    argv = sys.argv[1:] if argv is None else argv
    if "--quantized" in argv:  # the FP8-output benchmark, gatednorm.bench.quantized
        from gatednorm.bench import quantized

        return quantized.main([a for a in argv if a != "--quantized"])
    args = parse_args(argv)
    cache_root = _fresh_cache_dirs() if args.fresh_cache else None

    if args.smoke:
        case_list, budget, mode = cases.smoke_cases(), timing.SMOKE, "smoke"
    elif args.quick:
        case_list, budget, mode = cases.quick_cases(), timing.QUICK, "quick"
    else:
        case_list, budget, mode = cases.full_cases(), timing.FULL, "full"
    case_list = cases.select(case_list, args.cases)
    try:
        selected = providers.select(args.providers)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    if args.list:
        _print_list(case_list, selected)
        return 0
    if not case_list:
        print(f"no case matches --cases {args.cases!r}", file=sys.stderr)
        return 2

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if timing.is_cuda(device):
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    elif args.smoke:
        # Tiny tensors: OpenMP threads only add spin-waiting, badly so on a loaded machine.
        torch.set_num_threads(1)
    options = providers.Options(rounding=args.rounding, compile_backend=args.compile_backend or (
        "inductor" if timing.is_cuda(device) else "aot_eager"))
    budget_s = args.budget_s if args.budget_s is not None else (
        FULL_BUDGET_S if mode == "full" else None)
    budget_s = budget_s or None
    gpu = torch.cuda.get_device_name(device) if timing.is_cuda(device) else "cpu"
    if args.out is not None:
        out, update, out_why = args.out, False, "--out"
    else:
        out, update, out_why = results.output_path(device, mode, gpu, bool(args.providers))
    previous = results.load(out) if update else None

    copy_bytes = COPY_BYTES_CUDA if timing.is_cuda(device) else COPY_BYTES_CPU
    ctx = Context(device=device, budget=budget, options=options,
                  copy_gbps=timing.copy_bandwidth_gbps(device, copy_bytes, budget),
                  all_peers=args.all_peers,
                  same_bytes_copy=((timing.is_cuda(device) or mode == "smoke")
                                   and not args.no_same_bytes_copy))
    triton_init_s = (warm_triton(ctx)
                     if any(p.name == providers.SUBJECT for p in selected) else None)
    _progress(_start_message(mode, gpu, device, case_list, selected, ctx, out, out_why))
    header = {
        "gpu": gpu,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "gatednorm": gatednorm.__version__,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": _command(argv),
        "copy_gbps": ctx.copy_gbps,
        "mode": mode,
        "subject_path": _subject_path(device),
        "python": platform.python_version(),
        "git_commit": results.git_commit(),
        "fla": providers.fla_version(),
        "device": results.device_info(device),
        "options": asdict(options),
        "budget": asdict(budget),
        "budget_s": budget_s,
        "all_peers": args.all_peers,
        "fresh_cache": cache_root is not None,
        "cache_dir": cache_root,
        "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
        "triton_init_s": triton_init_s,
        "providers": [{"name": p.name, "description": p.description,
                       "status": "missing" if p.missing() else "available",
                       "reason": p.missing()} for p in selected],
        "cases": [c.describe() for c in case_list],
    }

    def result_with(records: list[dict], complete: bool) -> dict:
        run = results.single_run(header, records, list(ctx.same_bytes_copies),
                                 list(ctx.first_calls.values()))
        run.update(runtime_s=time.perf_counter() - started, complete=complete)
        return run if previous is None else results.merge(previous, run)

    records = run_cases(case_list, selected, ctx, budget_s, started,
                        save_partial=lambda done: report.write_json(out, result_with(done, False)))
    result = result_with(records, True)
    report.write_json(out, result)
    plot_note = None if args.no_plot else report.plot(result, out.with_suffix(".png"))
    # The table shows this run's records only (the file may hold earlier runs' cases too).
    run_cases_only = {c.name for c in case_list}
    print(report.format_report({**result, "records": [
        r for r in result["records"] if r["case"] in run_cases_only]}))
    written = [str(out)] + ([str(out.with_suffix(".png"))]
                            if not args.no_plot and plot_note is None else [])
    print(f"\nwrote {' and '.join(written)}" + (f" ({out_why})" if update else "")
          + (f"; {plot_note}" if plot_note else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
