"""The check every conversion goes through: the source's own forward against its replacement.

One probe is a few rows of random x and gate (and a random weight in place of the module's,
so that ones at initialization cannot hide a rounding or a grouping), in the module's dtype on
its device, through the original forward and through the replacement, with a gate and, where
the source accepts it, without. On the eager reference path (CPU tensors without
``TRITON_INTERPRET``) the two must give the same bits; on the Triton kernels the replacement's
error against the fp64 result of the same formula may be at most twice the source's own error
plus one unit of the output dtype (the project's tolerance rule). A model is probed once per
distinct configuration (class, options, dtype, device): a Qwen3-Next with 48 layers has one.
On the kernels the source must also lie within a few units of its dtype of the converted
formula's fp64 value, so that a module computing something else (another grouping) cannot pass
on the strength of its own large "error".
"""

from __future__ import annotations

from typing import Callable

import torch

from gatednorm import reference
from gatednorm.ops import runs_fused
from gatednorm.integrations.calling import forward_like_source, ungated
from gatednorm.integrations.shapes import GatedNormSpec

PROBE_SHAPE = (2, 3)  # batch, sequence: six rows per call
# A module computing the converted formula lies within this many units of its output dtype
# (at the top of the range) of the formula's fp64 value: at most three roundings to a 16-bit
# dtype ("hf"), each half a unit of a value no larger than the top.
_FORMULA_UNITS = 4

# call(weight, x, gate) -> y, gate possibly None
Call = Callable[[torch.Tensor | None, torch.Tensor, torch.Tensor | None], torch.Tensor]


class ConversionCheckError(ValueError):
    """A replacement that does not reproduce its source's forward on the probe."""


def _probe_dtype(weight: torch.Tensor | None) -> torch.dtype:
    if weight is not None and weight.dtype in (torch.float32, torch.bfloat16, torch.float16):
        return weight.dtype
    return torch.float32


def probe_inputs(spec: GatedNormSpec, weight: torch.Tensor | None, *, device=None,
                 dtype=None, rows: tuple[int, ...] = PROBE_SHAPE):
    """x, gate and a stand-in weight: seeded, from a private generator (the caller's random
    stream is not touched), away from ones."""
    generator = torch.Generator().manual_seed(0)
    device = device if device is not None else (weight.device if weight is not None else "cpu")
    dtype = dtype or _probe_dtype(weight)
    shape = (*rows, spec.hidden_size)
    x = (torch.randn(shape, generator=generator) * 2).to(device=device, dtype=dtype)
    gate = (torch.randn(shape, generator=generator) * 2).to(device=device, dtype=dtype)
    probe_weight = None
    if weight is not None:
        noise = 0.5 * torch.randn(spec.hidden_size, generator=generator)
        probe_weight = (1.0 + noise).to(device=device, dtype=weight.dtype)
    return x, gate, probe_weight


def _truth(spec: GatedNormSpec, weight, x, gate) -> torch.Tensor:
    w = None if weight is None else weight.double()
    if gate is None:
        return ungated(spec, w, x.double())
    return reference.rms_norm_gated(x.double(), gate.double(), w, **spec.module_options())


def _measure(expected: torch.Tensor, actual: torch.Tensor, truth: torch.Tensor | None) -> str:
    """'' when ``actual`` is acceptable, else what is wrong with it."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return (f"gives {actual.dtype} {tuple(actual.shape)} where the module gives "
                f"{expected.dtype} {tuple(expected.shape)}")
    difference = (actual.double() - expected.double())
    max_abs = difference.abs().max().item() if difference.numel() else 0.0
    relative = (difference.norm() / expected.double().norm().clamp_min(1e-300)).item()
    measured = f"differs by {max_abs:.3e} at most ({relative:.2e} relative L2)"
    if truth is None:
        return "" if torch.equal(actual, expected) else measured + ", expected the same bits"
    unit = torch.finfo(actual.dtype).eps * (truth.abs().max().item() if truth.numel() else 0.0)
    own_error = (expected.double() - truth).abs().max().item()
    if own_error > _FORMULA_UNITS * unit:
        # The module itself is not the spec's formula rounded to its dtype: another op.
        return (f"{measured}; the module is {own_error:.3e} away from the converted formula "
                f"in fp64, more than its rounding explains ({_FORMULA_UNITS * unit:.3e})")
    error = (actual.double() - truth).abs().max().item()
    allowed = 2 * own_error + unit
    if error <= allowed and torch.isfinite(actual).all():
        return ""
    return (f"{measured}; its error against fp64 is {error:.3e}, the module's own "
            f"{own_error:.3e}, allowed {allowed:.3e}")


def check(source: Call, replacement: Call, spec: GatedNormSpec, weight: torch.Tensor | None, *,
          where: str, ungated_call: bool) -> None:
    """Run the probe through ``source`` and ``replacement``; raise on a mismatch.

    Args:
        source, replacement: ``call(weight, x, gate)`` of each.
        spec: what the replacement was built from.
        weight: the source's weight (its dtype and device set the probe's), or None.
        where: ``"path (class)"`` for the message.
        ungated_call: also compare ``gate=None`` (where both accept it).

    Raises:
        ConversionCheckError: naming ``where``, the case and the measured difference, or the
            exception the source or the replacement raised on the probe.
    """
    x, gate, probe_weight = probe_inputs(spec, weight)
    # flash-linear-attention's kernel computes silu as g * sigmoid(g), torch as one op: its
    # conversion is held to the tolerance even where the replacement runs eager PyTorch.
    exact = not runs_fused(x) and spec.shape != "fla"
    for case_gate in ((gate, None) if ungated_call else (gate,)):
        case = "with a gate" if case_gate is not None else "without a gate"
        try:
            with torch.no_grad():
                expected = source(probe_weight, x, case_gate)
                actual = replacement(probe_weight, x, case_gate)
        except Exception as error:  # noqa: BLE001 - reported with its type, never swallowed
            raise ConversionCheckError(
                f"{where}: the conversion check ({case}) raised "
                f"{type(error).__name__}: {error}") from error
        truth = None if exact else _truth(spec, probe_weight, x, case_gate)
        problem = _measure(expected, actual, truth)
        if problem:
            raise ConversionCheckError(
                f"{where}: the replacement ({spec.shape}, rounding {spec.rounding!r}, group size "
                f"{spec.group_size}) {problem} on the probe {case} ({x.dtype}, {x.device}); "
                f"not converted")


def reproduces(module: torch.nn.Module, spec: GatedNormSpec) -> bool:
    """Whether ``spec``'s eager composite gives the same bits as ``module``'s forward, on CPU
    copies of probe inputs in fp32 and bf16, with a gate and (where the spec takes None)
    without. Used to recognize a class gatednorm has not seen; any exception means no."""
    for dtype in (torch.float32, torch.bfloat16):
        x, gate, weight = probe_inputs(spec, torch.empty(spec.hidden_size, dtype=dtype),
                                       device="cpu", rows=(4, 8))
        for case_gate in ((gate, None) if spec.gate_optional else (gate,)):
            try:
                with torch.no_grad():
                    args = (x,) if case_gate is None else (x, case_gate)
                    expected = torch.func.functional_call(module, {"weight": weight}, args)
                    actual = forward_like_source(spec, weight, x, case_gate,
                                                 norm=reference.rms_norm_gated)
            except Exception:  # noqa: BLE001 - a module that cannot run this is not this shape
                return False
            if not isinstance(expected, torch.Tensor) or _measure(expected, actual, None):
                return False
    return True
