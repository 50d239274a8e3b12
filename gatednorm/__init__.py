"""gatednorm: fused gated RMSNorm kernels (Triton), forward and backward."""

from gatednorm import reference
from gatednorm.functional import rms_norm_gated
from gatednorm.module import RMSNormGated
from gatednorm.options import GatedNormOptions

__all__ = ["GatedNormOptions", "RMSNormGated", "reference", "rms_norm_gated"]
__version__ = "0.1.0"
