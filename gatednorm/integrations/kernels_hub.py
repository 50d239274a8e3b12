"""gatednorm as the ``RMSNormGated`` layer of the ``kernels`` package (Hugging Face's kernel hub).

transformers marks its gated norms ``@use_kernel_forward_from_hub("RMSNormGated")``;
``kernels.kernelize`` then replaces the ``forward`` of every such module by the layer that the
active kernel mapping names for ``RMSNormGated``. :func:`mapping` names gatednorm's layer, served
from this package (a repository object whose ``load`` returns the layer class, the protocol
``kernels``' own repositories implement): no hub download, no build directory::

    from kernels import Mode, kernelize, use_kernel_mapping
    from gatednorm.integrations import kernels_hub

    with use_kernel_mapping(kernels_hub.mapping()):
        kernelize(model, mode=Mode.TRAINING, device="cuda")

The layer reads each module's own attributes, so every class keeps its convention (Qwen3-Next's
``hf`` rounding, Kimi Linear's ``fp32``, ...). Each distinct configuration is checked against the
class's own forward on a probe (:mod:`gatednorm.integrations.probe`) the first time a module
runs, or for the whole model at once with :func:`check`, which names the module paths. The
``kernels`` package is needed only to call ``kernelize``; this module does not import it until
:func:`mapping` is called.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from gatednorm.integrations import convert, probe
from gatednorm.integrations.calling import forward_like_source
from gatednorm.integrations.shapes import GatedNormSpec, source_name

LAYER_NAME = "RMSNormGated"
_SPEC = "_gatednorm_spec"
# Configuration (class, its forward, spec, weight dtype, device) -> '' or the failure message.
_CHECKED: dict[tuple, str] = {}


def _original(module: nn.Module) -> nn.Module:
    # A private copy that runs the class's own forward (kernelize set the instance's).
    clone = copy.deepcopy(module)
    clone.__dict__.pop("forward", None)
    clone.__dict__.pop(_SPEC, None)
    return clone


def _prepare(module: nn.Module, where: str | None = None) -> GatedNormSpec:
    spec = convert.describe(module)
    weight = module.weight
    # The class's forward is part of the key: a class patched or reloaded is checked again.
    key = (type(module), type(module).forward, spec, weight.dtype, weight.device)
    if key not in _CHECKED and weight.device.type != "meta":
        def replacement(w, x, gate):
            return forward_like_source(spec, w, x, gate)
        try:
            probe.check(convert.source_call(_original(module), spec), replacement, spec, weight,
                        where=where or source_name(module), ungated_call=spec.gate_optional)
            _CHECKED[key] = ""
        except probe.ConversionCheckError as error:
            _CHECKED[key] = str(error)
    if _CHECKED.get(key):
        raise probe.ConversionCheckError(_CHECKED[key])
    module.__dict__[_SPEC] = spec
    return spec


@torch.compiler.disable
def _prepare_on_first_call(module: nn.Module) -> GatedNormSpec:
    return _prepare(module)


class GatedNormLayer(nn.Module):
    """The layer ``kernelize`` binds to each ``RMSNormGated``-decorated module.

    A hub layer may not define members of its own beyond ``forward`` and the two capability
    flags: its ``forward`` runs with ``self`` the original module, whose ``weight``,
    ``variance_epsilon``, ``activation``, ``group_size`` ... it reads.
    """

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states: torch.Tensor, gate: torch.Tensor | None = None):
        spec = self.__dict__.get(_SPEC)
        if spec is None:
            spec = _prepare_on_first_call(self)
        return forward_like_source(spec, self.weight, hidden_states, gate)


class _Repository:
    """A ``kernels`` layer repository that is this Python package: ``load`` returns the
    layer class, nothing is downloaded."""

    layer_name = LAYER_NAME

    def load(self) -> type[nn.Module]:
        return GatedNormLayer

    def __str__(self) -> str:
        return f"gatednorm (Python package), layer `{GatedNormLayer.__qualname__}`"


REPOSITORY = _Repository()


def mapping(devices: tuple[str, ...] = ("cuda", "cpu")) -> dict:
    """The kernel mapping that points ``RMSNormGated`` at gatednorm on ``devices``, for every
    mode (inference, training, each with or without ``torch.compile``).

    With ``use_kernel_mapping(mapping())`` (it inherits the active mapping by default) the entry
    replaces transformers' default for those devices (flash-linear-attention's
    ``FusedRMSNormGated``). CPU tensors run gatednorm's eager reference (or the Triton
    interpreter under ``TRITON_INTERPRET=1``).
    """
    from kernels import Mode

    modes = (Mode.INFERENCE, Mode.TRAINING, Mode.INFERENCE | Mode.TORCH_COMPILE,
             Mode.TRAINING | Mode.TORCH_COMPILE)
    return {LAYER_NAME: {device: dict.fromkeys(modes, REPOSITORY) for device in devices}}


def is_kernelized(module: nn.Module) -> bool:
    """Whether ``kernelize`` bound gatednorm's layer to ``module``."""
    forward = module.__dict__.get("forward")
    return getattr(forward, "__func__", None) is GatedNormLayer.forward


def check(model: nn.Module) -> list[str]:
    """Check every module of ``model`` that runs gatednorm's layer, now, once per configuration.

    Returns:
        The qualified names of those modules.

    Raises:
        ConversionCheckError: naming the first module path whose configuration fails.
        UnsupportedModuleError: a module whose attributes do not fit its forward shape.
    """
    names = []
    for name, module in model.named_modules():
        if is_kernelized(module):
            _prepare(module, where=f"{name} ({source_name(module)})")
            names.append(name)
    return names
