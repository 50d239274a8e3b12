"""Swap the gated norms of a loaded transformers model for gatednorm, in place, and back.

    from gatednorm.integrations import transformers as gn_transformers

    model = AutoModelForCausalLM.from_pretrained(...)   # or from_config
    report = gn_transformers.patch(model)               # report.replaced, report.skipped
    ...                                                 # train / generate as usual
    gn_transformers.unpatch(model)                      # the original modules, trained weights

Only module instances are touched (no class is monkey-patched), so other models in the process
and models built later are unaffected. Each replacement is a :class:`TransformersRMSNormGated`
that takes over the source's weight Parameter (same object: state_dict keys, dtype, device,
optimizer references and Parameter attributes are unchanged) and keeps the source's calling
convention. Each distinct configuration is checked once against the source's own forward
(:mod:`gatednorm.integrations.probe`) before anything is replaced.
"""

from __future__ import annotations

import dataclasses
import warnings

import torch
from torch import nn

from gatednorm.integrations import convert, probe
from gatednorm.integrations.calling import forward_like_source
from gatednorm.integrations.shapes import GatedNormSpec, UnsupportedModuleError, source_name
from gatednorm.module import RMSNormGated

__all__ = ["PatchReport", "TransformersRMSNormGated", "patch", "unpatch"]


class TransformersRMSNormGated(RMSNormGated):
    """:class:`gatednorm.RMSNormGated` with the calling convention of the module it replaces.

    ``forward(hidden_states, gate=None)``:

    - with a gate: the fused op, with the options of :func:`convert.describe` (same numerics
      as the source's eager forward). The gate may be in any float dtype (every source upcasts
      it); an fp32 ``hidden_states`` may meet a bf16 weight.
    - without a gate: the source's plain RMSNorm in eager PyTorch (not fused) where the source
      accepts gate=None; a TypeError where it does not.
    - output: the source's dtype (x's, or ``promote_types(x, weight)`` for the gate-first
      Mamba2-style modules, which return ``weight * normed`` without a final cast) and shape:
      x and gate broadcast as the sources' multiply does, and FalconH1 of transformers < 5.23
      squeezes a single step [B, 1, D] to [B, D].

    A wider weight than x in the promoting modules (an fp32 weight with bf16 x) is the one case
    that is not bit-exact: the source returns the unrounded fp32 product, this module the
    product rounded to x's dtype and widened. The Mamba2-style mixers cast that output to the
    activation dtype before ``out_proj``, which makes the two equal again.
    """

    def __init__(self, spec: GatedNormSpec, *, device=None, dtype=None):
        super().__init__(spec.hidden_size, **spec.module_options(), device=device, dtype=dtype)
        self.spec = spec
        if spec.shape == "falcon-h1":
            self.n_groups = spec.hidden_size // (spec.group_size or spec.hidden_size)

    @property
    def variance_epsilon(self) -> float:
        """The source's name for ``eps`` (Mamba2-style mixers pass it to mamba-ssm kernels)."""
        return self.eps

    @classmethod
    def from_module(cls, module: nn.Module, *, check: bool = True) -> "TransformersRMSNormGated":
        """A replacement for ``module`` with its own copy of the weight, checked on a probe
        unless ``check`` is False (see :func:`gatednorm.integrations.from_module`)."""
        spec = convert.describe(module)
        new = cls._around(module, spec)
        new.weight = nn.Parameter(module.weight.detach().clone(),
                                  requires_grad=module.weight.requires_grad)
        if check:
            _check(module, new, spec, where=spec.source)
        return new

    @classmethod
    def _around(cls, module: nn.Module, spec: GatedNormSpec) -> "TransformersRMSNormGated":
        # Built on the meta device, then given the source's own weight Parameter.
        if not spec.has_weight:
            raise UnsupportedModuleError(
                f"{spec.source} has no weight; use gatednorm.integrations.from_module")
        new = cls(spec, device="meta", dtype=module.weight.dtype)
        new.weight = module.weight
        return new

    def forward(self, hidden_states: torch.Tensor,
                gate: torch.Tensor | None = None) -> torch.Tensor:
        return forward_like_source(self.spec, self.weight, hidden_states, gate)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, source={self.spec.source}"


def _check(source: nn.Module, replacement: TransformersRMSNormGated, spec: GatedNormSpec, *,
           where: str) -> None:
    def replaced(weight, x, gate):
        return forward_like_source(spec, weight, x, gate)
    probe.check(convert.source_call(source, spec), replaced, spec, source.weight, where=where,
                ungated_call=spec.gate_optional)


@dataclasses.dataclass
class PatchReport:
    """What :func:`patch` did.

    Attributes:
        replaced: qualified names of the replaced modules, in module order.
        skipped: qualified name -> why, for every gated-looking module left as it was.
        probes: how many conversion checks ran (one per distinct configuration).
    """

    replaced: list[str] = dataclasses.field(default_factory=list)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    probes: int = 0


def _children(model: nn.Module):
    """(qualified name, parent, attribute, child) for every edge of the module tree, shared
    modules included (a module reachable from two parents is listed under both)."""
    for parent_name, parent in model.named_modules(remove_duplicate=True):
        for attribute, child in parent.named_children():
            if child is not None:
                name = f"{parent_name}.{attribute}" if parent_name else attribute
                yield name, parent, attribute, child


def _has_hooks(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or hasattr(module, "_hf_hook"))


def _config_key(module: nn.Module, spec: GatedNormSpec) -> tuple:
    weight = module.weight
    return type(module), spec, weight.dtype, weight.device


class _Patcher:
    """One :func:`patch` call: each module converted and checked once, each configuration
    probed once, failures raised (strict) or recorded."""

    def __init__(self, strict: bool):
        self.strict = strict
        self.report = PatchReport()
        self.replacements: dict[int, TransformersRMSNormGated | None] = {}
        self.checked: dict[tuple, str] = {}  # configuration -> '' or the failure message

    def _skip(self, name: str, why: str) -> None:
        self.report.skipped[name] = why

    def _convert(self, name: str, child: nn.Module) -> TransformersRMSNormGated | None:
        where = f"{name} ({source_name(child)})"
        if type(child).__module__.split(".")[0] == "fla":
            self._skip(name, "flash-linear-attention's forward takes residual arguments; "
                             "convert it with gatednorm.integrations.from_module")
            return None
        known = convert.is_supported(child)
        try:
            spec = convert.describe(child)
        except UnsupportedModuleError as error:
            if known and self.strict:
                raise UnsupportedModuleError(f"{name}: {error}") from error
            self._skip(name, str(error))
            return None
        if child.weight.device.type == "meta":
            self._skip(name, "its weight is on the meta device: nothing to check or run")
            return None
        key = _config_key(child, spec)
        replacement = TransformersRMSNormGated._around(child, spec)
        if key not in self.checked:
            self.report.probes += 1
            try:
                _check(child, replacement, spec, where=where)
                self.checked[key] = ""
            except probe.ConversionCheckError as error:
                self.checked[key] = str(error)
        failure = self.checked[key]
        if failure:
            if self.strict:
                raise probe.ConversionCheckError(failure if where in failure
                                                 else f"{where}: {failure}")
            self._skip(name, failure)
            return None
        replacement.train(child.training)
        # Kept outside _modules so that state_dict, .to() and named_modules ignore it.
        replacement.__dict__["_gatednorm_source"] = child
        return replacement

    def run(self, model: nn.Module) -> PatchReport:
        hooked = []
        for name, parent, attribute, child in list(_children(model)):
            if isinstance(child, TransformersRMSNormGated):
                continue
            if not (convert.is_supported(child) or convert.looks_gated(child)):
                continue
            if id(child) not in self.replacements:
                self.replacements[id(child)] = self._convert(name, child)
            replacement = self.replacements[id(child)]
            if replacement is None:
                self.report.skipped.setdefault(name, "shared with a module that was skipped")
                continue
            if _has_hooks(child):
                hooked.append(name)
            setattr(parent, attribute, replacement)
            self.report.replaced.append(name)
        if self.report.skipped:
            lines = "; ".join(f"{n}: {why}" for n, why in self.report.skipped.items())
            warnings.warn(f"gatednorm patch left these modules as they were: {lines}",
                          stacklevel=3)
        if hooked:
            warnings.warn(f"gatednorm patch dropped the hooks of the modules it replaced "
                          f"(they stay on the originals): {', '.join(hooked)}", stacklevel=3)
        return self.report


def patch(model: nn.Module, *, strict: bool = True) -> PatchReport:
    """Replace every gated norm in ``model`` that gatednorm reproduces by a
    :class:`TransformersRMSNormGated`, after checking it.

    Instance-level and in place: the model's class and every other model are untouched. Each
    replacement adopts the source's weight Parameter, so dtype, device, state_dict keys,
    optimizer references and Parameter attributes are unchanged; call it on a model built by
    ``from_pretrained`` or ``from_config``, before or after creating the optimizer. A module
    shared by several parents gets one replacement, shared the same way. Already patched
    modules are left alone.

    Each distinct configuration (class, options, weight dtype and device) is first run on a
    probe through the source's forward and through the replacement
    (:mod:`gatednorm.integrations.probe`): a few rows, the cost of one tiny forward per
    configuration. Modules of a known class whose attributes do not fit (no weight, a group
    size that does not divide the width) or that fail the check raise with ``strict`` (the
    error names the module path, the class and the measured difference); with
    ``strict=False`` they are left as they were, with a warning, and listed in the report.
    Gated-looking modules that are another op, or an unknown class whose forward matches no
    known shape, are always left as they were and listed (with a warning). Hooks registered on
    a replaced module are not carried over (a warning names those modules).

    Returns:
        :class:`PatchReport`: the replaced and skipped module names, and the probe count.
    """
    return _Patcher(strict).run(model)


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
        source = child.__dict__["_gatednorm_source"]
        source.weight = child.weight
        source.train(child.training)
        setattr(parent, attribute, source)
        restored.append(name)
    return restored
