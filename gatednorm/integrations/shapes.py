"""The forward shapes of the gated norms that gatednorm reproduces, and how to read each.

A *forward shape* is what a module's ``forward`` computes, up to the values of its attributes:
the order of norm and gate, where it rounds, whether it accepts ``gate=None``, its output dtype
and shape. A reader takes a module with that shape and returns its :class:`GatedNormSpec`,
taking every option from the module itself (``variance_epsilon``, ``activation``,
``group_size``, ``n_groups``, ``norm_before_gate``, the weight), never from its class name:

====================  =====================================================================
shape                 forward (transformers' eager modules, flash-linear-attention)
====================  =====================================================================
``norm-gate-hf``      ``weight * normalize(x.float()).to(dtype) * act(gate.float())``, cast
                      to x's dtype; gate required (rounding ``hf``)
``norm-gate-fp32``    ``weight.float() * normalize(x.float()) * act(gate.float())``, one cast
                      to x's dtype; gate required (rounding ``fp32``)
``gate-norm-hf``      ``weight * normalize(x.float() * silu(gate.float())).to(dtype)`` per
                      group of ``group_size`` (the whole row without that attribute), no
                      final cast; ``gate=None`` skips the gate (rounding ``hf``)
``falcon-h1``         fp32 throughout, ``n_groups`` groups, ``norm_before_gate`` either way,
                      ``gate=None`` skips the gate; a single step may be squeezed
``fla``               flash-linear-attention's kernels: fp32 math, ``activation`` attribute
====================  =====================================================================
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
from torch import nn

_ACTIVATIONS = {"silu": "silu", "swish": "silu", "sigmoid": "sigmoid"}


class UnsupportedModuleError(TypeError):
    """A module that gatednorm cannot convert; the message says which and why."""


@dataclasses.dataclass(frozen=True)
class GatedNormSpec:
    """A source gated-norm module described in gatednorm's terms.

    Attributes:
        source: ``module.ClassName`` of the source, for messages.
        shape: its forward shape (a key of :data:`FORWARD_SHAPES`).
        hidden_size: size of the last dim (the weight's length).
        eps, activation, norm_before_gate, group_size, rounding: the options of
            :class:`gatednorm.RMSNormGated` that reproduce the source's eager forward.
        gate_optional: the source's ``forward(x, gate=None)`` applies a plain RMSNorm.
        promotes_output: the source returns ``weight * normed`` without a final cast, so its
            output dtype is ``promote_types(x.dtype, weight.dtype)`` rather than x's dtype.
        squeezes_single_step: FalconH1 before transformers 5.23: a [B, 1, D] input returns
            [B, D].
        has_weight: False for a flash-linear-attention norm built without ``elementwise_affine``.
    """

    source: str
    shape: str
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


def source_name(module: nn.Module) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


def fail(module: nn.Module, why: str) -> UnsupportedModuleError:
    return UnsupportedModuleError(f"cannot convert {source_name(module)}: {why}")


def _attr(module: nn.Module, name: str):
    if not hasattr(module, name):
        raise fail(module, f"it has no attribute {name!r}")
    return getattr(module, name)


def _eps(module: nn.Module, name: str = "variance_epsilon") -> float:
    eps = _attr(module, name)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or eps < 0:
        raise fail(module, f"{name} must be a number >= 0, got {eps!r}")
    return float(eps)


def _hidden_size(module: nn.Module) -> int:
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        raise fail(module, f"expected a 1-D weight, got {type(weight).__name__}")
    return weight.shape[0]


def _activation(module: nn.Module, default: str | None = None) -> str:
    name = getattr(module, "activation", default)
    if name not in _ACTIVATIONS:
        raise fail(module, f"activation {name!r} is not one of {sorted(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]


def _group_size(module: nn.Module, hidden_size: int, group_size) -> int | None:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1 \
            or hidden_size % group_size:
        raise fail(module, f"group size {group_size!r} does not divide its width {hidden_size}")
    # One group over the whole row is the ungrouped norm: one configuration, not two.
    return None if group_size == hidden_size else group_size


def _norm_then_gate(rounding: str) -> Callable[[nn.Module], GatedNormSpec]:
    def read(module: nn.Module) -> GatedNormSpec:
        # transformers 4.57's Qwen3NextRMSNormGated has no activation attribute: its forward
        # calls F.silu. Unknown classes reach this shape only with the attribute
        # (SHAPE_ATTRIBUTES).
        return GatedNormSpec(
            source=source_name(module), shape=f"norm-gate-{rounding}",
            hidden_size=_hidden_size(module), eps=_eps(module),
            activation=_activation(module, default="silu"), norm_before_gate=True,
            group_size=None, rounding=rounding)
    return read


def _gate_then_norm(module: nn.Module) -> GatedNormSpec:
    # transformers 5.18's Mamba2 / Bamba / GraniteMoeHybrid norms have no group_size and
    # normalize whole rows; from 5.23 they carry group_size and normalize per group.
    hidden_size = _hidden_size(module)
    group_size = None
    if hasattr(module, "group_size"):
        group_size = _group_size(module, hidden_size, module.group_size)
    return GatedNormSpec(
        source=source_name(module), shape="gate-norm-hf", hidden_size=hidden_size,
        eps=_eps(module), activation="silu", norm_before_gate=False, group_size=group_size,
        rounding="hf", gate_optional=True, promotes_output=True)


def _squeezes_single_step(module: nn.Module, hidden_size: int) -> bool:
    # transformers 5.18's FalconH1 returns [B, D] for a [B, 1, D] input, 5.23's keeps
    # [B, 1, D]: ask the module, on one CPU row with a stand-in weight.
    probe = torch.ones(1, 1, hidden_size)
    with torch.no_grad():
        out = torch.func.functional_call(module, {"weight": torch.ones(hidden_size)}, (probe,))
    return out.dim() == 2


def _falcon_h1(module: nn.Module) -> GatedNormSpec:
    hidden_size = _hidden_size(module)
    n_groups = _attr(module, "n_groups")
    if isinstance(n_groups, bool) or not isinstance(n_groups, int) or n_groups < 1 \
            or hidden_size % n_groups:
        raise fail(module, f"n_groups {n_groups!r} does not divide its width {hidden_size}")
    return GatedNormSpec(
        source=source_name(module), shape="falcon-h1", hidden_size=hidden_size,
        eps=_eps(module), activation="silu",
        norm_before_gate=bool(_attr(module, "norm_before_gate")),
        group_size=_group_size(module, hidden_size, hidden_size // n_groups), rounding="fp32",
        gate_optional=True, squeezes_single_step=_squeezes_single_step(module, hidden_size))


def _fla(module: nn.Module) -> GatedNormSpec:
    # FLA's Triton kernel: fp32 math from loaded values, y = xhat * w * act(g) stored in x's
    # dtype. Its residual/prenorm arguments are not part of the converted module.
    if getattr(module, "bias", None) is not None:
        raise fail(module, "a bias is not supported")
    weight = getattr(module, "weight", None)
    hidden_size = int(_attr(module, "hidden_size")) if weight is None else _hidden_size(module)
    return GatedNormSpec(
        source=source_name(module), shape="fla", hidden_size=hidden_size,
        eps=_eps(module, "eps"), activation=_activation(module, default="swish"),
        norm_before_gate=True, group_size=None, rounding="fp32", has_weight=weight is not None)


FORWARD_SHAPES: dict[str, Callable[[nn.Module], GatedNormSpec]] = {
    "norm-gate-hf": _norm_then_gate("hf"),
    "norm-gate-fp32": _norm_then_gate("fp32"),
    "gate-norm-hf": _gate_then_norm,
    "falcon-h1": _falcon_h1,
    "fla": _fla,
}

# The attributes a module of each shape carries: an unknown class is only tried against the
# shapes whose attributes it has (fla is never guessed: its forward takes other arguments).
SHAPE_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "falcon-h1": ("weight", "variance_epsilon", "n_groups", "norm_before_gate"),
    "gate-norm-hf": ("weight", "variance_epsilon"),
    "norm-gate-hf": ("weight", "variance_epsilon", "activation"),
    "norm-gate-fp32": ("weight", "variance_epsilon", "activation"),
}
