"""python -m gatednorm.bench: check and time gatednorm against its peers; JSON, table and plot.

    python -m gatednorm.bench                       # full run (its bf16 cases: 6.5 min on an H200)
    python -m gatednorm.bench --quick               # a third of the cases, fewer repetitions
    python -m gatednorm.bench --smoke --out s.json  # tiny shapes, every code path, runs on CPU
    python -m gatednorm.bench --cases head128,decode --providers gatednorm,fla --fresh-cache
    python -m gatednorm.bench --list                # the cases and providers, then exit

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
import functools
import gc
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import triton

import gatednorm
from gatednorm.bench import cases, providers, report, timing

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
    parser.add_argument("--out", type=Path, help="results JSON (default: benchmarks/results/"
                                                 "<gpu>-<date>.json on a GPU); the plot goes "
                                                 "beside it as .png")
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


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True,
                               cwd=Path(__file__).resolve().parent, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def _gpu_slug(name: str) -> str:
    words = name.lower().replace("nvidia", "").split()
    return "-".join(words) or "gpu"


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Context:
    """What every case of one run shares."""

    device: torch.device
    budget: timing.Budget
    options: providers.Options
    copy_gbps: float
    all_peers: bool = False
    same_bytes_copy: bool = False
    first_calls: dict = field(default_factory=dict)
    same_bytes_copies: list = field(default_factory=list)


def _placeholders(provider_name: str, case, status: str, reason: str) -> list[dict]:
    base = {"provider": provider_name, **case.describe(), "status": status, "error": reason,
            "median_ms": None, "gbps": None, "frac_copy": None}
    if case.is_decode:
        return [{**base, "pass": "fwd", "mode": mode, "us_per_call": None}
                for mode in ("eager", "graph")]
    return [{**base, "pass": pass_} for pass_ in cases.PASSES]


def _timed_record(base: dict, case, pass_: str, median_ms: float, ctx: Context) -> dict:
    nbytes = case.bytes_moved(pass_)
    gbps = nbytes / (median_ms * 1e-3) / 1e9 if median_ms > 0 else None
    return {**base, "pass": pass_, "median_ms": median_ms, "bytes": nbytes, "gbps": gbps,
            "frac_copy": gbps / ctx.copy_gbps if gbps is not None else None}


def _first_call_entry(ctx: Context, case, fwd_s: float, bwd_s: float | None) -> None:
    """gatednorm's first call per kernel configuration: D (or group), dtype, options, layout."""
    config = (f"group={case.group} {case.dtype_name} {case.activation} "
              f"{'norm-then-gate' if case.norm_before_gate else 'gate-first'} "
              f"{case.gate_layout}{' decode' if case.is_decode else ''}")
    if config not in ctx.first_calls:
        ctx.first_calls[config] = {"config": config, "case": case.name,
                                   "fwd_first_call_s": fwd_s, "bwd_first_call_s": bwd_s}


def measure_training(provider, case, sets, truth, ctx: Context) -> list[dict]:
    """First calls and check, then fwd, bwd and fwd+bwd timings of one provider on one case."""
    fn = provider.build(case, ctx.options)
    first = sets[0]
    fwd_s, y = timing.first_call_s(providers.forward_call(fn, first), ctx.device)
    bwd_s, grads = timing.first_call_s(
        functools.partial(torch.autograd.grad, y, first.differentiable(), first.dy), ctx.device)
    checked = providers.check(case, truth, y, grads)
    del y, grads
    if provider.name == providers.SUBJECT:
        _first_call_entry(ctx, case, fwd_s, bwd_s)
    base = {"provider": provider.name, **case.describe(), **checked,
            "status": "ok" if checked["correct"] else "wrong", "error": None,
            "n_sets": len(sets)}

    def timed(pass_, calls, **extra):
        t = timing.measure(calls, ctx.device, ctx.budget)
        return _timed_record({**base, "p20_ms": t.p20_ms, "p80_ms": t.p80_ms, "reps": t.reps,
                              **extra}, case, pass_, t.median_ms, ctx)

    fwd = timed("fwd", [providers.forward_call(fn, s) for s in sets], first_call_s=fwd_s)
    both = timed("fwd+bwd", [providers.forward_backward_call(fn, s) for s in sets])
    try:
        bwd = timed("bwd", [providers.backward_call(fn, s) for s in sets],
                    first_call_s=bwd_s, bwd_method="retained-graph")
    except Exception as error:  # noqa: BLE001 - report and fall back, never abort the run
        bwd = _timed_record({**base, "first_call_s": bwd_s,
                             "bwd_method": f"fwd+bwd minus fwd (retained graph failed: "
                                           f"{type(error).__name__}: {error})"},
                            case, "bwd", both["median_ms"] - fwd["median_ms"], ctx)
    return [fwd, bwd, both]


def measure_decode(provider, case, sets, truth, ctx: Context) -> list[dict]:
    """Inference forward per call: eager (host overhead included) and CUDA graph replay."""
    fn = provider.build(case, ctx.options)
    call = providers.forward_call(fn, sets[0])
    records = []
    with torch.no_grad():
        fwd_s, y = timing.first_call_s(call, ctx.device)
        checked = providers.check(case, truth, y, None)
        del y
        if provider.name == providers.SUBJECT:
            _first_call_entry(ctx, case, fwd_s, None)
        base = {"provider": provider.name, **case.describe(), **checked,
                "status": "ok" if checked["correct"] else "wrong", "error": None, "n_sets": 1,
                "calls": ctx.budget.decode_calls, "trials": ctx.budget.decode_trials}
        eager_us = timing.per_call_us(call, ctx.device, ctx.budget.decode_calls,
                                      ctx.budget.decode_trials)
        records.append(_timed_record({**base, "mode": "eager", "us_per_call": eager_us,
                                      "first_call_s": fwd_s}, case, "fwd", eager_us / 1e3, ctx))
        if not timing.is_cuda(ctx.device):
            records.append({**base, "pass": "fwd", "mode": "graph", "status": "n/a",
                            "error": "CUDA graphs need a CUDA device", "median_ms": None,
                            "gbps": None, "frac_copy": None, "us_per_call": None})
            return records
        try:
            replay = timing.capture_graph(call, timing.GRAPH_CALLS)
            graph_us = timing.per_call_us(replay, ctx.device, ctx.budget.decode_calls,
                                          ctx.budget.decode_trials) / timing.GRAPH_CALLS
            records.append(_timed_record({**base, "mode": "graph", "us_per_call": graph_us,
                                          "calls_per_graph": timing.GRAPH_CALLS},
                                         case, "fwd", graph_us / 1e3, ctx))
        except Exception as error:  # noqa: BLE001
            records.append({**base, "pass": "fwd", "mode": "graph", "status": "error",
                            "error": f"{type(error).__name__}: {error}", "median_ms": None,
                            "gbps": None, "frac_copy": None, "us_per_call": None})
    return records


def _not_runnable(provider, case, ctx: Context) -> tuple[str, str] | None:
    """(status, reason) when ``provider`` will not be timed on ``case``, else None."""
    unsupported = provider.unsupported(case)
    if unsupported is not None:
        return "n/a", unsupported
    missing = provider.missing()
    if missing is not None:
        return "missing", missing
    if not ctx.all_peers and case.providers and provider.name not in case.providers:
        return "skipped", ("not timed on this case by default, to bound the run "
                           "(--all-peers times it)")
    return None


def measure_same_bytes_copy(case, ctx: Context) -> list[dict]:
    """Per pass, copies moving the pass's bytes (half read, half written; the forward and the
    backward one launch each, fwd+bwd both in turn), timed like the pass: what a kernel at
    the large copy's speed per byte but of this size could reach."""
    entries = []
    halves = {p: case.bytes_moved(p) // 2 for p in ("fwd", "bwd")}
    for pass_, sizes in (("fwd", [halves["fwd"]]), ("bwd", [halves["bwd"]]),
                         ("fwd+bwd", [halves["fwd"], halves["bwd"]])):
        median_ms = timing.same_bytes_copy_ms(sizes, ctx.device, ctx.budget)
        gbps = 2 * sum(sizes) / (median_ms * 1e-3) / 1e9
        entries.append({"case": case.name, "pass": pass_, "bytes": 2 * sum(sizes),
                        "launches": len(sizes), "median_ms": median_ms, "gbps": gbps,
                        "frac_copy": gbps / ctx.copy_gbps})
    return entries


def run_case(case, selected, ctx: Context) -> list[dict]:
    """Every selected provider on one case: placeholders for those that cannot run it."""
    by_provider: dict[str, list[dict]] = {}
    runnable = []
    for provider in selected:
        reason = _not_runnable(provider, case, ctx)
        if reason is None:
            runnable.append(provider)
        else:
            by_provider[provider.name] = _placeholders(provider.name, case, *reason)
    if runnable:
        n_sets = timing.rotation_sets(case, ctx.device, ctx.budget)
        sets = [case.make_inputs(ctx.device, seed=i) for i in range(n_sets)]
        truth = providers.oracle(case, sets[0], ctx.options)
        measure = measure_decode if case.is_decode else measure_training
    for provider in runnable:
        try:
            by_provider[provider.name] = measure(provider, case, sets, truth, ctx)
        except Exception as error:  # noqa: BLE001 - one provider's failure must not stop the run
            by_provider[provider.name] = _placeholders(provider.name, case, "error",
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
        values = [(f"{r['us_per_call']:.1f}" if case.is_decode else f"{r['median_ms']:.3f}")
                  if report.timed(r) else r["status"] for r in mine]
        flag = " WRONG" if any(r["status"] == "wrong" for r in mine) else ""
        parts.append(f"{provider} {'/'.join(values)}{unit}{flag}")
    return f"{case.name} ({'/'.join(shown)}): " + ", ".join(parts)


def _warm_triton(ctx: Context) -> float | None:
    """One tiny gatednorm forward and backward in a configuration no case uses, so that
    Triton's one-time setup (driver, launcher build) is not charged to the first case."""
    if not (timing.is_cuda(ctx.device) or os.environ.get("TRITON_INTERPRET") == "1"):
        return None
    x = torch.randn(2, 8, device=ctx.device, requires_grad=True)
    gate = torch.randn(2, 8, device=ctx.device, requires_grad=True)

    def call():
        y = gatednorm.rms_norm_gated(x, gate, activation="sigmoid", rounding="fp32")
        return torch.autograd.grad(y, (x, gate), torch.ones_like(y))

    seconds, _ = timing.first_call_s(call, ctx.device)
    return seconds


def _device_info(device) -> dict:
    if not timing.is_cuda(device):
        return {"type": "cpu", "processor": platform.processor() or platform.machine(),
                "l2_bytes_assumed": timing.l2_bytes(device)}
    props = torch.cuda.get_device_properties(device)
    return {"type": "cuda", "name": props.name, "capability": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count, "memory_bytes": props.total_memory,
            "l2_bytes": timing.l2_bytes(device), "cuda": torch.version.cuda}


def _default_out(device, mode: str, gpu: str, filtered: bool) -> Path:
    """benchmarks/results/<gpu>-<date>.json for a full GPU run (-quick, -subset when not
    full); a temporary file for smoke and CPU runs."""
    date = datetime.date.today().isoformat()
    if timing.is_cuda(device) and mode != "smoke":
        tags = ([] if mode == "full" else [mode]) + (["subset"] if filtered else [])
        name = "-".join([_gpu_slug(gpu), date, *tags]) + ".json"
        return Path("benchmarks") / "results" / name
    return Path(tempfile.gettempdir()) / "gatednorm-bench" / f"{mode}-{device.type}-{date}.json"


def _skip_case(case, selected, ctx: Context, budget_s: float) -> list[dict]:
    """Placeholders for a case the run did not reach within its time budget."""
    records = []
    for provider in selected:
        reason = _not_runnable(provider, case, ctx) or (
            "skipped", f"not reached within --budget-s {budget_s:.0f}")
        records += _placeholders(provider.name, case, *reason)
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


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
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
    out = args.out or _default_out(device, mode, gpu, bool(args.cases or args.providers))

    copy_bytes = COPY_BYTES_CUDA if timing.is_cuda(device) else COPY_BYTES_CPU
    ctx = Context(device=device, budget=budget, options=options,
                  copy_gbps=timing.copy_bandwidth_gbps(device, copy_bytes, budget),
                  all_peers=args.all_peers,
                  same_bytes_copy=((timing.is_cuda(device) or mode == "smoke")
                                   and not args.no_same_bytes_copy))
    triton_init_s = (_warm_triton(ctx)
                     if any(p.name == providers.SUBJECT for p in selected) else None)
    _progress(f"gatednorm bench ({mode}): {gpu}, {len(case_list)} cases, providers "
              f"{', '.join(p.name for p in selected)}; copy {ctx.copy_gbps:.0f} GB/s")
    header = {
        "gpu": gpu,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": _command(argv),
        "copy_gbps": ctx.copy_gbps,
        "mode": mode,
        "python": platform.python_version(),
        "gatednorm": gatednorm.__version__,
        "git_commit": _git_commit(),
        "fla": providers.fla_version(),
        "device": _device_info(device),
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
        return {**header, "first_calls": list(ctx.first_calls.values()),
                "same_bytes_copy": list(ctx.same_bytes_copies), "records": records,
                "runtime_s": time.perf_counter() - started, "complete": complete}

    records = run_cases(case_list, selected, ctx, budget_s, started,
                        save_partial=lambda done: report.write_json(out, result_with(done, False)))
    result = result_with(records, True)
    report.write_json(out, result)
    plot_note = None if args.no_plot else report.plot(result, out.with_suffix(".png"))
    print(report.format_report(result))
    written = [str(out)] + ([str(out.with_suffix(".png"))]
                            if not args.no_plot and plot_note is None else [])
    print(f"\nwrote {' and '.join(written)}" + (f" ({plot_note})" if plot_note else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
