"""Recognize a framework's gated-RMSNorm module and describe it in gatednorm's terms.

Each supported class is identified by its name and the package that defines it (a class of the
same name elsewhere, such as a model's remote code, may compute something else), and its
attributes are read into a :class:`GatedNormSpec`: the options of :class:`gatednorm.RMSNormGated`
that reproduce its eager forward, plus how it is called (is the gate optional, what dtype and
shape it returns). The readers follow the sources in transformers 5.18 and flash-linear-attention:

=============================  =========  ==========  =========  ==========  =====================
class                          rounding   activation  order      groups      gate=None
=============================  =========  ==========  =========  ==========  =====================
Qwen3NextRMSNormGated,         ``hf``     silu        norm,gate  no          not accepted
Qwen3_5(Moe)RMSNormGated,
OlmoHybridRMSNormGated,
Qwen4ExpTextRMSNormGated
KimiLinearRMSNormGated,        ``fp32``   sigmoid     norm,gate  no          not accepted
Glm5NextTextRMSNormGated
MambaRMSNormGated (Mamba2),    ``hf``     silu        gate,norm  no          plain RMSNorm
BambaRMSNormGated,
GraniteMoeHybridRMSNormGated
Zamba2RMSNormGated (also used  ``hf``     silu        gate,norm  group_size  plain RMSNorm
by Nemotron-H),
NemotronHRMSNormGated
FalconH1RMSNormGated           ``fp32``   silu        either     n_groups    plain RMSNorm
FusedRMSNormGated (FLA),       ``fp32``   activation  norm,gate  no          not accepted
FusedRMSNormSwishGate (FLA)
=============================  =========  ==========  =========  ==========  =====================

``hf``: the normalized value is rounded to x's dtype and multiplied by the weight in the weight's
dtype (``weight * normed.to(input_dtype)``). ``fp32``: every step in fp32 (the weight is upcast),
one rounding at the end. See :mod:`gatednorm.reference`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
from torch import nn

from gatednorm.module import RMSNormGated

_ACTIVATIONS = {"silu": "silu", "swish": "silu", "sigmoid": "sigmoid"}


class UnsupportedModuleError(TypeError):
    """Raised for a module that gatednorm cannot convert; the message lists what it can."""


@dataclasses.dataclass(frozen=True)
class GatedNormSpec:
    """A source gated-norm module described in gatednorm's terms.

    Attributes:
        source: ``module.class_name`` of the source, for messages.
        hidden_size: size of the last dim (the weight's length).
        eps, activation, norm_before_gate, group_size, rounding: the options of
            :class:`gatednorm.RMSNormGated` that reproduce the source's eager forward.
        gate_optional: the source's ``forward(x, gate=None)`` applies a plain RMSNorm.
        promotes_output: the source returns ``weight * normed`` without a final cast, so its
            output dtype is ``promote_types(x.dtype, weight.dtype)`` rather than x's dtype.
        squeezes_single_step: FalconH1's layout: a [B, 1, D] input returns [B, D].
        has_weight: False for a flash-linear-attention norm built without ``elementwise_affine``.
    """

    source: str
    hidden_size: int
    eps: float
    activation: str
    norm_before_gate: bool
    group_size: int | None
    rounding: str
    gate_optional: bool = False
    promotes_output: bool = False
    squeezes_single_step: bool = False
    has_weight: bool = True

    def module_options(self) -> dict:
        """Keyword arguments of :class:`gatednorm.RMSNormGated` (after ``hidden_size``)."""
        return dict(eps=self.eps, zero_centered_gamma=False, activation=self.activation,
                    norm_before_gate=self.norm_before_gate, group_size=self.group_size,
                    rounding=self.rounding)


def _source_name(module: nn.Module) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


def _fail(module: nn.Module, why: str) -> UnsupportedModuleError:
    return UnsupportedModuleError(f"cannot convert {_source_name(module)}: {why}")


def _attr(module: nn.Module, name: str):
    if not hasattr(module, name):
        raise _fail(module, f"it has no attribute {name!r}")
    return getattr(module, name)


def _hidden_size(module: nn.Module) -> int:
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        raise _fail(module, f"expected a 1-D weight, got {type(weight).__name__}")
    return weight.shape[0]


def _activation(module: nn.Module, default: str | None = None) -> str:
    name = getattr(module, "activation", default)
    if name not in _ACTIVATIONS:
        raise _fail(module, f"activation {name!r} is not one of {sorted(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]


def _group_size(module: nn.Module, hidden_size: int, group_size: int) -> int:
    if group_size < 1 or hidden_size % group_size:
        raise _fail(module, f"group size {group_size} does not divide hidden size {hidden_size}")
    return group_size


def _gate_after(rounding: str) -> Callable[[nn.Module], GatedNormSpec]:
    # forward(hidden_states, gate): normalize in fp32, scale, multiply by act(gate.float()),
    # cast to the input dtype. Qwen3-Next's family rounds before the weight ("hf"); Kimi
    # Linear's upcasts the weight and rounds once ("fp32").
    def read(module: nn.Module) -> GatedNormSpec:
        return GatedNormSpec(
            source=_source_name(module), hidden_size=_hidden_size(module),
            eps=float(_attr(module, "variance_epsilon")), activation=_activation(module),
            norm_before_gate=True, group_size=None, rounding=rounding)
    return read


def _gate_first(grouped: bool) -> Callable[[nn.Module], GatedNormSpec]:
    # forward(hidden_states, gate=None): x.float() * silu(gate.float()) when gated, normalize
    # (per group of group_size for Zamba2's layout), return weight * normed.to(input_dtype)
    # with no final cast: a wider weight widens the output.
    def read(module: nn.Module) -> GatedNormSpec:
        hidden_size = _hidden_size(module)
        group_size = None
        if grouped:
            group_size = _group_size(module, hidden_size, int(_attr(module, "group_size")))
        return GatedNormSpec(
            source=_source_name(module), hidden_size=hidden_size,
            eps=float(_attr(module, "variance_epsilon")), activation="silu",
            norm_before_gate=False, group_size=group_size, rounding="hf", gate_optional=True,
            promotes_output=True)
    return read


def _falcon_h1(module: nn.Module) -> GatedNormSpec:
    # forward(hidden_states, gate=None): fp32 throughout (weight * fp32 normed promotes), one
    # cast to the input dtype; n_groups groups over the last dim; accepts [B, S, D] or [B, D]
    # and squeezes a single-step [B, 1, D] result to [B, D].
    hidden_size = _hidden_size(module)
    n_groups = int(_attr(module, "n_groups"))
    if n_groups < 1 or hidden_size % n_groups:
        raise _fail(module, f"n_groups {n_groups} does not divide hidden size {hidden_size}")
    return GatedNormSpec(
        source=_source_name(module), hidden_size=hidden_size,
        eps=float(_attr(module, "variance_epsilon")), activation="silu",
        norm_before_gate=bool(_attr(module, "norm_before_gate")),
        group_size=hidden_size // n_groups, rounding="fp32", gate_optional=True,
        squeezes_single_step=True)


def _fla(module: nn.Module) -> GatedNormSpec:
    # FLA's Triton kernel: fp32 math from loaded values, y = xhat * w * act(g) stored in x's
    # dtype. Its residual/prenorm arguments are not part of the converted module.
    if getattr(module, "bias", None) is not None:
        raise _fail(module, "a bias is not supported")
    weight = getattr(module, "weight", None)
    hidden_size = int(_attr(module, "hidden_size")) if weight is None else _hidden_size(module)
    return GatedNormSpec(
        source=_source_name(module), hidden_size=hidden_size, eps=float(_attr(module, "eps")),
        activation=_activation(module, default="swish"), norm_before_gate=True,
        group_size=None, rounding="fp32", has_weight=weight is not None)


# (defining package, class name) -> reader. The package is the first component of the
# class's __module__: a same-named class from elsewhere is not assumed to compute the same.
_READERS: dict[tuple[str, str], Callable[[nn.Module], GatedNormSpec]] = {
    ("transformers", "Qwen3NextRMSNormGated"): _gate_after("hf"),
    ("transformers", "Qwen3_5RMSNormGated"): _gate_after("hf"),
    ("transformers", "Qwen3_5MoeRMSNormGated"): _gate_after("hf"),
    ("transformers", "OlmoHybridRMSNormGated"): _gate_after("hf"),
    ("transformers", "Qwen4ExpTextRMSNormGated"): _gate_after("hf"),
    ("transformers", "KimiLinearRMSNormGated"): _gate_after("fp32"),
    ("transformers", "Glm5NextTextRMSNormGated"): _gate_after("fp32"),
    ("transformers", "MambaRMSNormGated"): _gate_first(grouped=False),
    ("transformers", "BambaRMSNormGated"): _gate_first(grouped=False),
    ("transformers", "GraniteMoeHybridRMSNormGated"): _gate_first(grouped=False),
    ("transformers", "Zamba2RMSNormGated"): _gate_first(grouped=True),
    ("transformers", "NemotronHRMSNormGated"): _gate_first(grouped=True),
    ("transformers", "FalconH1RMSNormGated"): _falcon_h1,
    ("fla", "FusedRMSNormGated"): _fla,
    ("fla", "FusedRMSNormSwishGate"): _fla,
}


def supported_classes() -> list[str]:
    """``package:ClassName`` of every convertible class."""
    return [f"{package}:{name}" for package, name in _READERS]


def _reader(module: nn.Module):
    cls = type(module)
    return _READERS.get((cls.__module__.split(".")[0], cls.__name__))


def is_supported(module: nn.Module) -> bool:
    """Whether :func:`describe` recognizes ``module``'s class (its attributes are not checked)."""
    return _reader(module) is not None


def describe(module: nn.Module) -> GatedNormSpec:
    """The :class:`GatedNormSpec` of a supported module.

    Raises:
        UnsupportedModuleError: the class is not supported (the message lists those that are),
            or its attributes do not have the expected layout.
    """
    reader = _reader(module)
    if reader is None:
        raise UnsupportedModuleError(
            f"{_source_name(module)} is not a supported gated norm; supported classes "
            f"(package:class): {', '.join(supported_classes())}")
    return reader(module)


def from_module(module: nn.Module) -> RMSNormGated:
    """An equivalent :class:`gatednorm.RMSNormGated` with its own copy of ``module``'s weight.

    The new module has the source's weight values, dtype, device and ``requires_grad`` in a
    new Parameter (training one does not move the other), and the eps, activation, norm order,
    group size and rounding convention that reproduce the source's eager forward for a given
    gate (see the table in this module's docstring). It is called as ``forward(x, gate)``; for
    a replacement that also keeps the source's signature, gate=None behaviour and output
    dtype/shape, use :mod:`gatednorm.integrations.transformers`.

    A flash-linear-attention norm without a weight (``elementwise_affine=False``) becomes a
    module whose weight is ones with ``requires_grad=False`` (the same numerics).

    Raises:
        UnsupportedModuleError: see :func:`describe`.
    """
    spec = describe(module)
    source_weight = module.weight if spec.has_weight else None
    if source_weight is None:
        new = RMSNormGated(spec.hidden_size, **spec.module_options())
        new.weight.requires_grad_(False)
        return new
    new = RMSNormGated(spec.hidden_size, **spec.module_options(), device="meta",
                       dtype=source_weight.dtype)
    new.weight = nn.Parameter(source_weight.detach().clone(),
                              requires_grad=source_weight.requires_grad)
    return new
