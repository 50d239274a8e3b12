"""Recognize a framework's gated-RMSNorm module and describe it in gatednorm's terms.

The class table says only which forward shape (:mod:`gatednorm.integrations.shapes`) a known
class has; every option is then read from the module's own attributes. A class is known by its
name and the package that defines it (a class of the same name in a model's remote code may
compute something else). A class not in the table whose name marks it as a gated norm is
recognized by its behaviour: the forward shape whose eager composite reproduces its forward bit
for bit on CPU probes, among the shapes whose attributes it has. Every conversion is then
checked on the module's own device and dtype (:mod:`gatednorm.integrations.probe`).

======================================================  ==============  ===========================
class (transformers unless marked)                      forward shape   options read
======================================================  ==============  ===========================
Qwen3NextRMSNormGated, Qwen3_5(Moe)RMSNormGated,        norm-gate-hf    variance_epsilon, activation
OlmoHybridRMSNormGated, Qwen4ExpTextRMSNormGated                        (SiLU without it)
KimiLinearRMSNormGated, Glm5NextTextRMSNormGated,       norm-gate-fp32  variance_epsilon, activation
BailingHybridRMSNormGated, LaraMiniRMSNormGated                         (SiLU without it)
MambaRMSNormGated / Mamba2RMSNormGated, Bamba-,         gate-norm-hf    variance_epsilon, group_size
GraniteMoeHybrid-, Zamba2-, NemotronHRMSNormGated                       (whole row without it)
FalconH1RMSNormGated                                    falcon-h1       variance_epsilon, n_groups,
                                                                        norm_before_gate
FusedRMSNormGated, FusedRMSNormSwishGate (fla)          fla             eps, activation, weight
======================================================  ==============  ===========================

``AXK2GatedRMSNorm`` (transformers) is another op, ``y * sigmoid(mlp(y))`` for ``y =
RMSNorm(x)``: gated by an MLP of its own output, not by a gate input; it is never converted.
"""

from __future__ import annotations

import torch
from torch import nn

from gatednorm.integrations import probe
from gatednorm.integrations.shapes import (
    FORWARD_SHAPES,
    SHAPE_ATTRIBUTES,
    GatedNormSpec,
    UnsupportedModuleError,
    source_name,
)
from gatednorm.module import RMSNormGated

_NORM_GATE_HF = ("Qwen3NextRMSNormGated", "Qwen3_5RMSNormGated", "Qwen3_5MoeRMSNormGated",
                 "OlmoHybridRMSNormGated", "Qwen4ExpTextRMSNormGated")
_NORM_GATE_FP32 = ("KimiLinearRMSNormGated", "Glm5NextTextRMSNormGated",
                   "BailingHybridRMSNormGated", "LaraMiniRMSNormGated")
_GATE_NORM_HF = ("MambaRMSNormGated", "Mamba2RMSNormGated", "BambaRMSNormGated",
                 "GraniteMoeHybridRMSNormGated", "Zamba2RMSNormGated", "NemotronHRMSNormGated")

# (defining package, class name) -> forward shape.
CLASS_SHAPES: dict[tuple[str, str], str] = {
    **{("transformers", name): "norm-gate-hf" for name in _NORM_GATE_HF},
    **{("transformers", name): "norm-gate-fp32" for name in _NORM_GATE_FP32},
    **{("transformers", name): "gate-norm-hf" for name in _GATE_NORM_HF},
    ("transformers", "FalconH1RMSNormGated"): "falcon-h1",
    ("fla", "FusedRMSNormGated"): "fla",
    ("fla", "FusedRMSNormSwishGate"): "fla",
}

# Gated-looking classes that compute another op, and what it is.
OTHER_OPS: dict[tuple[str, str], str] = {
    ("transformers", "AXK2GatedRMSNorm"): (
        "another op: y * sigmoid(mlp(y)) for y = RMSNorm(x), gated by an MLP of its own "
        "output rather than by a gate input"),
}


def _key(module: nn.Module) -> tuple[str, str]:
    cls = type(module)
    return cls.__module__.split(".")[0], cls.__name__


def supported_classes() -> list[str]:
    """``package:ClassName`` of every class in the table."""
    return [f"{package}:{name}" for package, name in CLASS_SHAPES]


def looks_gated(module: nn.Module) -> bool:
    """Whether the class name marks a gated norm (``RMSNormGated``, ``GatedRMSNorm``, ...)."""
    name = type(module).__name__
    return "Gated" in name and "Norm" in name


def is_supported(module: nn.Module) -> bool:
    """Whether ``module``'s class is in the table (its attributes are not checked)."""
    return _key(module) in CLASS_SHAPES


def other_op(module: nn.Module) -> str | None:
    """Why a gated-looking class is a different op, or None."""
    return OTHER_OPS.get(_key(module))


def _identify(module: nn.Module) -> GatedNormSpec:
    tried = []
    for shape, attributes in SHAPE_ATTRIBUTES.items():
        if not all(hasattr(module, a) for a in attributes):
            continue
        tried.append(shape)
        try:
            spec = FORWARD_SHAPES[shape](module)
        except (UnsupportedModuleError, RuntimeError):
            continue
        if probe.reproduces(module, spec):
            return spec
    raise UnsupportedModuleError(
        f"{source_name(module)} is not a known gated norm and its forward matches no known "
        f"shape (tried: {', '.join(tried) or 'none: it lacks the attributes of every shape'}); "
        f"known classes (package:class): {', '.join(supported_classes())}")


def describe(module: nn.Module) -> GatedNormSpec:
    """The :class:`GatedNormSpec` that reproduces ``module``'s forward.

    Options are read from the module's attributes; the class table gives the forward shape,
    or, for a gated-looking class not in it, the shape that reproduces its forward bit for bit
    on CPU probes (see the module docstring).

    Raises:
        UnsupportedModuleError: another op, a class that is neither known nor gated-looking, a
            forward that matches no known shape, or attributes that do not fit the shape (no
            1-D weight, a group size that does not divide the width, ...).
    """
    why = other_op(module)
    if why is not None:
        raise UnsupportedModuleError(f"{source_name(module)} is {why}; it is not converted")
    shape = CLASS_SHAPES.get(_key(module))
    if shape is not None:
        return FORWARD_SHAPES[shape](module)
    if looks_gated(module):
        return _identify(module)
    raise UnsupportedModuleError(
        f"{source_name(module)} is not a supported gated norm; supported classes "
        f"(package:class): {', '.join(supported_classes())}")


def source_call(module: nn.Module, spec: GatedNormSpec) -> probe.Call:
    """``call(weight, x, gate)`` of ``module``'s forward with ``weight`` in place of its own."""
    def call(weight, x, gate):
        args = (x,) if gate is None else (x, gate)
        if not spec.has_weight:
            return module(*args)
        return torch.func.functional_call(module, {"weight": weight}, args)
    return call


def from_module(module: nn.Module, *, check: bool = True) -> RMSNormGated:
    """An equivalent :class:`gatednorm.RMSNormGated` with its own copy of ``module``'s weight.

    The new module has the source's weight values, dtype, device and ``requires_grad`` in a
    new Parameter (training one does not move the other), and the eps, activation, norm order,
    group size and rounding convention that reproduce the source's forward for a given gate
    (see :func:`describe`). It is called as ``forward(x, gate)``; for a replacement that also
    keeps the source's signature, gate=None behaviour and output dtype and shape, use
    :mod:`gatednorm.integrations.transformers`.

    With ``check`` (the default) the conversion is run once on a probe (see
    :mod:`gatednorm.integrations.probe`) against the source's own forward. A
    flash-linear-attention norm without a weight (``elementwise_affine=False``) becomes a
    module whose weight is ones with ``requires_grad=False``.

    Raises:
        UnsupportedModuleError: see :func:`describe`.
        ConversionCheckError: the probe found a difference (the message names the class and
            the measured difference).
    """
    spec = describe(module)
    source_weight = module.weight if spec.has_weight else None
    if source_weight is None:
        new = RMSNormGated(spec.hidden_size, **spec.module_options())
        new.weight.requires_grad_(False)
    else:
        new = RMSNormGated(spec.hidden_size, **spec.module_options(), device="meta",
                           dtype=source_weight.dtype)
        new.weight = nn.Parameter(source_weight.detach().clone(),
                                  requires_grad=source_weight.requires_grad)
    if check and (source_weight is None or source_weight.device.type != "meta"):
        def replacement(weight, x, gate):
            if weight is None:
                return new(x, gate)
            return torch.func.functional_call(new, {"weight": weight}, (x, gate))
        probe.check(source_call(module, spec), replacement, spec, source_weight,
                    where=spec.source, ungated_call=False)
    return new


__all__ = ["GatedNormSpec", "UnsupportedModuleError", "describe", "from_module", "is_supported",
           "supported_classes"]
