"""Eager PyTorch composites of the gated RMSNorm, one per rounding convention.

These are the specification of what the fused kernels compute. Each composite is written with
the same torch ops, in the same order and the same dtypes, as the framework code it reproduces,
so that autograd through it also reproduces that framework's backward:

- ``te``:   TransformerEngine's RMSNorm (fp32 math, output rounded to x's dtype), then the
            gate as the unfused pointwise op would apply it (Megatron's GDN path and its
            fused Triton kernel).
- ``fp32``: every intermediate in fp32, one rounding at the end (flash-linear-attention,
            Mamba's Triton kernel, vLLM, SGLang, Kimi Linear in transformers).
- ``hf``:   the transformers eager modules: the normalized value is rounded to x's dtype,
            multiplied by a low-precision weight in that precision (Qwen3-Next / Qwen3.5 with
            the gate after the norm, Mamba2 / Nemotron-H / Zamba2 with the gate first;
            Falcon-H1's module computes in fp32 and matches ``fp32``).

Called with float64 tensors every rounding is the identity, which makes any composite the fp64
ground truth the tests compare against.

All functions take ``x`` and ``gate`` of shape ``[..., D]``, ``weight`` of shape ``[D]`` or None,
and return ``y`` with x's shape and dtype. They validate nothing: use
:func:`gatednorm.rms_norm_gated` for checked input.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ROUNDINGS = ("te", "fp32", "hf")
ACTIVATIONS = ("silu", "sigmoid")


def activation_fn(gate: torch.Tensor, activation: str) -> torch.Tensor:
    """SiLU or sigmoid of ``gate``, in ``gate``'s dtype."""
    return F.silu(gate) if activation == "silu" else torch.sigmoid(gate)


def rms_normalize(t: torch.Tensor, eps: float, group_size: int | None) -> torch.Tensor:
    """``t * rsqrt(mean(t^2) + eps)`` over each group of ``group_size`` along the last dim."""
    d = t.shape[-1]
    group = d if group_size is None else group_size
    grouped = t.unflatten(-1, (d // group, group))
    rstd = torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + eps)
    return (grouped * rstd).flatten(-2)


def _gamma(weight: torch.Tensor | None, zero_centered_gamma: bool) -> torch.Tensor | float:
    if weight is None:
        return 1.0
    return _upcast(weight) + 1.0 if zero_centered_gamma else _upcast(weight)


def _upcast(t: torch.Tensor) -> torch.Tensor:
    # float64 stays float64 so that the composite doubles as the exact reference.
    return t if t.dtype == torch.float64 else t.float()


def te(x, gate, weight=None, *, eps=1e-6, zero_centered_gamma=False, activation="silu",
       norm_before_gate=True, group_size=None):
    """TransformerEngine RMSNorm (fp32 compute, rounded output) and an unfused gate."""
    gamma = _gamma(weight, zero_centered_gamma)
    act = activation_fn(_upcast(gate), activation)
    if norm_before_gate:
        normed = (rms_normalize(_upcast(x), eps, group_size) * gamma).to(x.dtype)
        return (normed * act).to(x.dtype)
    gated = (_upcast(x) * act).to(x.dtype)
    return (rms_normalize(_upcast(gated), eps, group_size) * gamma).to(x.dtype)


def fp32(x, gate, weight=None, *, eps=1e-6, zero_centered_gamma=False, activation="silu",
         norm_before_gate=True, group_size=None):
    """Every intermediate in fp32; one rounding to x's dtype at the end."""
    gamma = _gamma(weight, zero_centered_gamma)
    act = activation_fn(_upcast(gate), activation)
    if norm_before_gate:
        return (rms_normalize(_upcast(x), eps, group_size) * gamma * act).to(x.dtype)
    return (rms_normalize(_upcast(x) * act, eps, group_size) * gamma).to(x.dtype)


def _hf_scale(normed: torch.Tensor, weight, zero_centered_gamma: bool) -> torch.Tensor:
    # transformers multiplies the rounded normalized value by the weight with PyTorch's type
    # promotion: a bf16 weight on bf16 activations gives a bf16 product, an fp32 one fp32.
    if weight is None:
        return normed
    if zero_centered_gamma:
        product_dtype = torch.promote_types(weight.dtype, normed.dtype)
        return ((_upcast(weight) + 1.0) * _upcast(normed)).to(product_dtype)
    return weight * normed


def hf(x, gate, weight=None, *, eps=1e-6, zero_centered_gamma=False, activation="silu",
       norm_before_gate=True, group_size=None):
    """The transformers eager modules (Qwen3-Next gate-after, Mamba2 gate-first)."""
    act = activation_fn(_upcast(gate), activation)
    if norm_before_gate:
        normed = rms_normalize(_upcast(x), eps, group_size).to(x.dtype)
        scaled = _hf_scale(normed, weight, zero_centered_gamma)
        return (scaled * act).to(x.dtype)
    normed = rms_normalize(_upcast(x) * act, eps, group_size).to(x.dtype)
    return _hf_scale(normed, weight, zero_centered_gamma).to(x.dtype)


_BY_ROUNDING = {"te": te, "fp32": fp32, "hf": hf}


def rms_norm_gated(x, gate, weight=None, *, eps=1e-6, zero_centered_gamma=False,
                   activation="silu", norm_before_gate=True, group_size=None, rounding="te"):
    """The composite for ``rounding``; same arguments as :func:`gatednorm.rms_norm_gated`."""
    return _BY_ROUNDING[rounding](
        x, gate, weight, eps=eps, zero_centered_gamma=zero_centered_gamma,
        activation=activation, norm_before_gate=norm_before_gate, group_size=group_size)



# The FP8 output's reference quantizers live in gatednorm.quantize.reference; they are named
# here too, loaded on first use (gatednorm.quantize imports this module).
_QUANTIZERS = ("columnwise_quantize", "dequantize", "quantize_1x128", "quantize_mxfp8",
               "quantize_per_tensor", "reference_quantize")


def __getattr__(name: str):
    if name in _QUANTIZERS:
        from gatednorm.quantize import reference as quantize_reference

        return getattr(quantize_reference, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
