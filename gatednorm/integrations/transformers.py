"""Swap the gated norms of a loaded transformers model for gatednorm, in place, and back.

    from gatednorm.integrations import transformers as gn_transformers

    model = AutoModelForCausalLM.from_pretrained(...)   # or from_config
    replaced = gn_transformers.patch(model)             # ["model.layers.0.linear_attn.norm", ...]
    ...                                                 # train / generate as usual
    gn_transformers.unpatch(model)                      # the original modules, trained weights

Only module instances are touched (no class is monkey-patched), so other models in the process
and models built later are unaffected. Each replacement is a :class:`TransformersRMSNormGated`
that takes over the source's weight Parameter (same object: state_dict keys, dtype, device,
optimizer references and Parameter attributes are unchanged) and keeps the source's calling
convention: ``forward(hidden_states, gate)`` or ``forward(hidden_states, gate=None)``, the source's
output dtype and shape, and its ``variance_epsilon`` / ``group_size`` / ``n_groups`` attributes,
which some mixers read directly. Which classes are recognized, and the rounding convention each
maps to, is in :mod:`gatednorm.integrations.convert`.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from gatednorm import reference
from gatednorm.functional import rms_norm_gated
from gatednorm.integrations.convert import GatedNormSpec, describe, is_supported
from gatednorm.module import RMSNormGated

__all__ = ["TransformersRMSNormGated", "patch", "unpatch"]


def _gate_operand(gate: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    # Every source computes act(gate.float()), so upcasting a gate that rms_norm_gated would
    # refuse (a bf16 gate with the fp32 scan output of the Mamba2 mixers) changes no bit.
    if gate.dtype in (x.dtype, torch.float32):
        return gate
    return gate.float()


def _weight_operand(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    # A bf16 weight times an fp32 normalized value is an fp32 product in every source, so an
    # fp32 x may take the weight upcast. Other mixes are left to rms_norm_gated's checks.
    if weight.dtype in (x.dtype, torch.float32) or x.dtype != torch.float32:
        return weight
    return weight.float()


def _broadcast(x: torch.Tensor, gate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # The sources multiply by the gate with broadcasting; normalizing each broadcast copy of a
    # row gives the same values, so expanded (stride-0) views reproduce them exactly.
    if x.shape == gate.shape:
        return x, gate
    shape = torch.broadcast_shapes(x.shape, gate.shape)
    return x.expand(shape), gate.expand(shape)


class TransformersRMSNormGated(RMSNormGated):
    """:class:`gatednorm.RMSNormGated` with the calling convention of the module it replaces.

    ``forward(hidden_states, gate=None)``:

    - with a gate: the fused op, with the options of :func:`convert.describe` (same numerics
      as the source's eager forward, see the rounding table there). The gate may be in any
      float dtype (every source upcasts it); an fp32 ``hidden_states`` may meet a bf16 weight.
    - without a gate: the source's plain RMSNorm in eager PyTorch (not fused) where the source
      accepts gate=None; a TypeError where it does not.
    - output: the source's dtype (x's, or ``promote_types(x, weight)`` for the gate-first
      Mamba2-style modules, which return ``weight * normed`` without a final cast) and shape:
      x and gate broadcast as the sources' multiply does, and FalconH1 squeezes a single step
      [B, 1, D] to [B, D] (before its gate in the norm-then-gate order, so that a [B, 1, D]
      gate broadcasts the result to [B, B, D] there, as in transformers).

    A wider weight than x in the promoting modules (an fp32 weight with bf16 x) is the one case
    that is not bit-exact: the source returns the unrounded fp32 product, this module the
    product rounded to x's dtype and widened. The Mamba2-style mixers cast that output to the
    activation dtype before ``out_proj``, which makes the two equal again.
    """

    def __init__(self, spec: GatedNormSpec, *, device=None, dtype=None):
        super().__init__(spec.hidden_size, **spec.module_options(), device=device, dtype=dtype)
        self.spec = spec
        if spec.squeezes_single_step:
            self.n_groups = spec.hidden_size // spec.group_size

    @property
    def variance_epsilon(self) -> float:
        """The source's name for ``eps`` (Mamba2-style mixers pass it to mamba-ssm kernels)."""
        return self.eps

    @classmethod
    def from_module(cls, module: nn.Module) -> "TransformersRMSNormGated":
        """A replacement for ``module`` with its own copy of the weight (see ``convert``)."""
        new = cls._around(module)
        new.weight = nn.Parameter(module.weight.detach().clone(),
                                  requires_grad=module.weight.requires_grad)
        return new

    @classmethod
    def _around(cls, module: nn.Module) -> "TransformersRMSNormGated":
        # Built on the meta device: the caller puts a real weight in.
        spec = describe(module)
        if not spec.has_weight:
            raise TypeError(f"{spec.source} has no weight; use gatednorm.RMSNormGated.from_module")
        new = cls(spec, device="meta", dtype=module.weight.dtype)
        new.weight = module.weight
        return new

    def _ungated(self, x: torch.Tensor) -> torch.Tensor:
        normed = reference.rms_normalize(x.float(), self.eps, self.group_size)
        if self.rounding == "hf":
            return self.weight * normed.to(x.dtype)
        return (self.weight * normed).to(x.dtype)

    def _squeeze_single_step(self, t: torch.Tensor) -> torch.Tensor:
        if self.spec.squeezes_single_step and t.dim() == 3 and t.shape[1] == 1:
            return t.squeeze(1)
        return t

    def forward(self, hidden_states: torch.Tensor,
                gate: torch.Tensor | None = None) -> torch.Tensor:
        x = hidden_states
        if gate is None:
            if not self.spec.gate_optional:
                raise TypeError(f"{self.spec.source} is called with a gate; got gate=None")
            return self._squeeze_single_step(self._ungated(x))
        if self.norm_before_gate:
            # FalconH1 squeezes the normalized single step before the gate multiplies it.
            x = self._squeeze_single_step(x)
        x, gate = _broadcast(x, gate)
        y = rms_norm_gated(
            x, _gate_operand(gate, x), _weight_operand(self.weight, x), eps=self.eps,
            activation=self.activation, norm_before_gate=self.norm_before_gate,
            group_size=self.group_size, rounding=self.rounding)
        if self.spec.promotes_output:
            y = y.to(torch.promote_types(x.dtype, self.weight.dtype))
        return y if self.norm_before_gate else self._squeeze_single_step(y)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, source={self.spec.source}"


def _source_of(replacement: TransformersRMSNormGated) -> nn.Module:
    return replacement.__dict__["_gatednorm_source"]


def _children(model: nn.Module):
    """(qualified name, parent, attribute, child) for every edge of the module tree, shared
    modules included (a module reachable from two parents is listed under both)."""
    for parent_name, parent in model.named_modules(remove_duplicate=True):
        for attribute, child in parent.named_children():
            if child is not None:
                name = f"{parent_name}.{attribute}" if parent_name else attribute
                yield name, parent, attribute, child


def _patchable(module: nn.Module) -> bool:
    # flash-linear-attention's modules take (x, g, residual, prenorm, ...): they convert with
    # RMSNormGated.from_module but are not swapped in place.
    return is_supported(module) and type(module).__module__.startswith("transformers.")


def _looks_gated(module: nn.Module) -> bool:
    name = type(module).__name__
    return "Gated" in name and "Norm" in name


def _has_hooks(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or hasattr(module, "_hf_hook"))


def patch(model: nn.Module) -> list[str]:
    """Replace every supported gated norm in ``model`` by a :class:`TransformersRMSNormGated`.

    Instance-level and in place: the model's class and every other model are untouched. Each
    replacement adopts the source's weight Parameter, so dtype, device, state_dict keys,
    optimizer references and Parameter attributes are unchanged; call it on a model built by
    ``from_pretrained`` or ``from_config``, before or after creating the optimizer. A module
    shared by several parents gets one replacement, shared the same way. Non-gated norms and
    already patched modules are left alone; gated-looking modules that are not patched (an
    unsupported class, or flash-linear-attention's, whose forward takes residual arguments)
    are left alone with a warning. Hooks registered on a replaced module are not carried over
    (a warning names those modules); patch before registering hooks or dispatching the model
    with offloaded weights.

    Returns:
        The qualified names of the replaced modules, in module order.
    """
    replacements: dict[int, TransformersRMSNormGated] = {}
    replaced, unsupported, hooked = [], set(), []
    for name, parent, attribute, child in list(_children(model)):
        if isinstance(child, TransformersRMSNormGated):
            continue
        if not _patchable(child):
            if _looks_gated(child):
                unsupported.add(f"{type(child).__module__}.{type(child).__qualname__}")
            continue
        if _has_hooks(child):
            hooked.append(name)
        if id(child) not in replacements:
            replacement = TransformersRMSNormGated._around(child)
            replacement.train(child.training)
            # Kept outside _modules so that state_dict, .to() and named_modules ignore it.
            replacement.__dict__["_gatednorm_source"] = child
            replacements[id(child)] = replacement
        setattr(parent, attribute, replacements[id(child)])
        replaced.append(name)
    if unsupported:
        warnings.warn(
            f"gatednorm patch left these gated norms in place (not patchable; see "
            f"gatednorm.integrations.convert.supported_classes()): "
            f"{', '.join(sorted(unsupported))}", stacklevel=2)
    if hooked:
        warnings.warn(f"gatednorm patch dropped the hooks of the modules it replaced "
                      f"(they stay on the originals): {', '.join(hooked)}", stacklevel=2)
    return replaced


def unpatch(model: nn.Module) -> list[str]:
    """Put back the modules that :func:`patch` replaced in ``model``.

    Each original gets the replacement's current weight Parameter (the same object), so what
    was trained, loaded or moved while patched is kept.

    Returns:
        The qualified names of the restored modules, in module order.
    """
    restored = []
    for name, parent, attribute, child in list(_children(model)):
        if not isinstance(child, TransformersRMSNormGated) or \
                "_gatednorm_source" not in child.__dict__:
            continue
        source = _source_of(child)
        source.weight = child.weight
        source.train(child.training)
        setattr(parent, attribute, source)
        restored.append(name)
    return restored
