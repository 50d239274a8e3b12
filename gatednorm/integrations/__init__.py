"""Framework integrations: convert, patch, the kernels-hub layer, Megatron-Core's GDN norm.

``gatednorm.integrations.from_module(module)`` converts one gated-norm module of transformers or
flash-linear-attention into a :class:`gatednorm.RMSNormGated`, checked against the module's own
forward. Nothing here imports transformers, kernels or Megatron.
"""

from gatednorm.integrations.convert import describe, from_module, supported_classes
from gatednorm.integrations.probe import ConversionCheckError
from gatednorm.integrations.shapes import GatedNormSpec, UnsupportedModuleError

__all__ = ["ConversionCheckError", "GatedNormSpec", "UnsupportedModuleError", "describe",
           "from_module", "supported_classes"]
