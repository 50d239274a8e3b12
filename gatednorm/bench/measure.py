"""One case's measurements: each provider's first calls, check and timed passes (training),
per-call times (decode), and the same-bytes copies; the records of :mod:`gatednorm.bench.report`.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

import torch

import gatednorm
from gatednorm.bench import cases, providers, timing


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


def placeholders(provider_name: str, case, status: str, reason: str) -> list[dict]:
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


def not_runnable(provider, case, ctx: Context) -> tuple[str, str] | None:
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


def warm_triton(ctx: Context) -> float | None:
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
