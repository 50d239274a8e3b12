"""Timing helpers: what each number measures, and how.

- :func:`measure` (kernel time of training-size calls): every call is bracketed by two CUDA
  events and the median of the per-call times is reported (with the 20th and 80th
  percentiles). Before each start event the stream runs a spin kernel
  (``torch.cuda._sleep``) that lasts longer than the host needs to issue the whole call
  (measured in the warm-up, at least SPACER_US): while it spins the host queues every kernel
  of the call, so the interval between the events is the GPU time of the call's kernels and
  of the gaps between them that the GPU itself cannot hide, for every provider alike. The host
  time a provider spends per call is what the decode measurements report. Calls rotate over several input sets
  holding more than 4x the L2 together (:func:`rotation_sets`), so each call reads its inputs
  from DRAM, as it would in a model where other layers ran in between. The number of calls is
  chosen from a warm-up estimate so that each measurement spends about ``target_ms``.
- :func:`copy_bandwidth_gbps`: a large device-to-device copy, timed the same way; bytes read
  plus bytes written over the median time. It is the ceiling every pass is compared to.
- :func:`same_bytes_copy_ms`: copies moving what one pass moves, timed as the pass (cold
  L2, single calls): what the pass's size alone allows, where the launch's ramp-up and last
  wave weigh more than in the large copy (a reference, not a bound: PyTorch's copy kernel has
  costs of its own, and gatednorm's forward beats it on some shapes).
- :func:`per_call_us` (decode): host wall clock of N back-to-back calls with one synchronize
  at the end, divided by N: host overhead included, as a serving loop sees it. With a CUDA
  graph (:func:`capture_graph`) the same clock times N replays of a graph holding
  GRAPH_CALLS forwards, divided by N x GRAPH_CALLS: the cost of one forward inside a captured
  decode step, where the graph's own launch is paid once for the whole step.
- :func:`first_call_s`: wall time of one synchronized call, compile and autotune included.

On a CPU-only machine (``--smoke``) ``time.perf_counter`` replaces the events and there is no
spin kernel; the numbers then only prove that the code paths run.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from gatednorm.bench.cases import Case

# Used when the device does not report its L2 size (the H200 has 60 MB).
DEFAULT_L2_BYTES = 60 * 2**20
# Rotated input sets together touch at least this many times the L2.
ROTATION_L2_MULTIPLE = 4
MIN_SETS = 2
# Spin before each timed call: at least this long, and longer than the host needs to issue
# the whole call (measured); never longer than MAX_SPACER_US.
SPACER_US = 200
MAX_SPACER_US = 50_000
WARMUP_CALLS = 3
# Forwards captured in one CUDA graph for the decode graph measurement.
GRAPH_CALLS = 32


@dataclass(frozen=True)
class Budget:
    """How long to measure: per-measurement device time aimed at, bounds on repetitions,
    decode loop sizes, and the memory the rotated input sets may take."""

    target_ms: float
    min_reps: int
    max_reps: int
    decode_calls: int
    decode_trials: int
    max_sets: int
    set_memory_bytes: int


FULL = Budget(target_ms=20.0, min_reps=10, max_reps=100, decode_calls=200, decode_trials=5,
              max_sets=8, set_memory_bytes=16 * 2**30)
QUICK = Budget(target_ms=10.0, min_reps=5, max_reps=50, decode_calls=100, decode_trials=3,
               max_sets=8, set_memory_bytes=16 * 2**30)
SMOKE = Budget(target_ms=0.1, min_reps=2, max_reps=3, decode_calls=3, decode_trials=2,
               max_sets=2, set_memory_bytes=2**30)


@dataclass(frozen=True)
class Timing:
    """Per-call times in milliseconds over ``reps`` timed calls."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    reps: int


def is_cuda(device: torch.device) -> bool:
    return device.type == "cuda"


def synchronize(device: torch.device) -> None:
    if is_cuda(device):
        torch.cuda.synchronize(device)


def l2_bytes(device: torch.device) -> int:
    if is_cuda(device):
        return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
                   or DEFAULT_L2_BYTES)
    return DEFAULT_L2_BYTES


def rotation_sets(case: Case, device: torch.device, budget: Budget) -> int:
    """How many input sets to rotate over: enough that one round of forwards touches
    ROTATION_L2_MULTIPLE x L2 (at least MIN_SETS), within ``budget``'s memory for the sets.
    Decode cases use one set: their inputs were just written by the previous layer, so a
    warm L2 is what a model sees."""
    if case.is_decode:
        return 1
    wanted = max(MIN_SETS, math.ceil(ROTATION_L2_MULTIPLE * l2_bytes(device)
                                     / case.bytes_moved("fwd")))
    fit = max(1, budget.set_memory_bytes // case.bytes_allocated())
    return min(wanted, fit, budget.max_sets)


@functools.cache
def _spin_cycles_per_us(device_index: int) -> float:
    """GPU clock cycles per microsecond of ``torch.cuda._sleep``."""
    calibration_cycles = 10**6
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(calibration_cycles)
    start.record()
    torch.cuda._sleep(calibration_cycles)
    end.record()
    end.synchronize()
    return calibration_cycles / (start.elapsed_time(end) * 1000.0)


def _spacer(device: torch.device, spacer_us: float) -> Callable[[], None]:
    if not hasattr(torch.cuda, "_sleep"):
        return lambda: None
    index = device.index if device.index is not None else torch.cuda.current_device()
    cycles = int(spacer_us * _spin_cycles_per_us(index))
    return lambda: torch.cuda._sleep(cycles)


def _timed_calls(calls: Sequence[Callable[[], object]], count: int, device: torch.device,
                 spacer_us: float = SPACER_US) -> tuple[list[float], list[float]]:
    """(GPU ms, host ms) per call of ``count`` calls cycling through ``calls``; the host time
    is the wall time to issue the call (on a CPU device both are the wall time)."""
    host = []
    if not is_cuda(device):
        for i in range(count):
            start = time.perf_counter()
            calls[i % len(calls)]()
            host.append((time.perf_counter() - start) * 1000.0)
        return host, host
    spin = _spacer(device, spacer_us)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    for i in range(count):
        spin()
        starts[i].record()
        issue = time.perf_counter()
        calls[i % len(calls)]()
        host.append((time.perf_counter() - issue) * 1000.0)
        ends[i].record()
        # One call at a time: the launch queue never fills, so issuing a call never blocks on
        # the GPU and the host time measured is the call's own.
        ends[i].synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)], host


def measure(calls: Sequence[Callable[[], object]], device: torch.device,
            budget: Budget) -> Timing:
    """Median per-call time of ``calls`` (rotated in order), after a warm-up of at least
    WARMUP_CALLS calls and one pass over every set. The warm-up also measures the host time
    to issue one call, and the spin before each timed call is made longer than that (twice
    the median warm-up call), so the timed interval never waits on the host. The repetition
    count comes from the warm-up's median so that the measurement spends about
    ``budget.target_ms``."""
    warmup, host = _timed_calls(calls, max(WARMUP_CALLS, len(calls)), device)
    spacer_us = min(MAX_SPACER_US, max(SPACER_US, 2000.0 * statistics.median(host)))
    estimate_ms = max(statistics.median(warmup), 1e-3)
    reps = min(budget.max_reps, max(budget.min_reps, math.ceil(budget.target_ms / estimate_ms)))
    times = sorted(_timed_calls(calls, reps, device, spacer_us)[0])
    return Timing(median_ms=statistics.median(times), p20_ms=_quantile(times, 0.2),
                  p80_ms=_quantile(times, 0.8), reps=reps)


def _quantile(sorted_times: list[float], q: float) -> float:
    return sorted_times[min(len(sorted_times) - 1, int(q * len(sorted_times)))]


def copy_bandwidth_gbps(device: torch.device, nbytes: int, budget: Budget) -> float:
    """Bytes read plus bytes written per second by ``dst.copy_(src)`` of ``nbytes`` random
    bytes, in GB/s (1e9)."""
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    timing = measure([lambda: dst.copy_(src)], device, budget)
    return 2 * nbytes / (timing.median_ms * 1e-3) / 1e9


def same_bytes_copy_ms(nbytes_per_copy: Sequence[int], device: torch.device, budget: Budget,
                       l2_multiple: int = ROTATION_L2_MULTIPLE) -> float:
    """Median time of one call made of back-to-back ``dst.copy_(src)`` of each size in
    ``nbytes_per_copy`` (one copy per kernel launch a pass stands for), timed as
    :func:`measure` times a pass: the sources and destinations rotate over enough pairs that
    the L2 is cold. A copy of half a pass's bytes (each read once and written once) moves
    what the pass moves, as many bytes per launch: its fraction of the large copy is what the
    pass's size alone allows, launch ramp-up and last wave included."""
    per_set = sum(nbytes_per_copy)
    wanted = max(MIN_SETS, math.ceil(l2_multiple * l2_bytes(device) / (2 * per_set)))
    fit = max(1, budget.set_memory_bytes // (2 * per_set))
    pairs = [[(torch.empty(n, dtype=torch.uint8, device=device).random_(0, 256),
               torch.empty(n, dtype=torch.uint8, device=device)) for n in nbytes_per_copy]
             for _ in range(min(wanted, fit, budget.max_sets))]

    def call(copies):
        for src, dst in copies:
            dst.copy_(src)
    return measure([functools.partial(call, copies) for copies in pairs], device,
                   budget).median_ms


def per_call_us(call: Callable[[], object], device: torch.device, calls: int,
                trials: int) -> float:
    """Median over ``trials`` of the wall time of ``calls`` back-to-back calls followed by one
    synchronize, per call, in microseconds."""
    per_trial = []
    for _ in range(trials):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            call()
        synchronize(device)
        per_trial.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(per_trial)


def capture_graph(call: Callable[[], object], calls_per_graph: int = 1) -> Callable[[], None]:
    """Capture ``calls_per_graph`` back-to-back ``call()`` into one CUDA graph (after a
    warm-up on a side stream, as CUDA graph capture requires) and return its replay. With
    several calls per graph, one replay's time over ``calls_per_graph`` is what each call
    costs inside a captured decode step, where the graph launch is paid once per step."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP_CALLS):
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = [call() for _ in range(calls_per_graph)]

    def replay():
        graph.replay()
    # The replay closure keeps the graph and its outputs (in the graph's private pool) alive.
    replay.output = outputs[-1]
    return replay


def first_call_s(call: Callable[[], object], device: torch.device) -> tuple[float, object]:
    """(seconds, result) of one synchronized call: compile, autotune and caching included."""
    synchronize(device)
    start = time.perf_counter()
    result = call()
    synchronize(device)
    return time.perf_counter() - start, result
