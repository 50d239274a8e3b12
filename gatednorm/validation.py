"""Argument checks for rms_norm_gated: every error names the argument and what was expected."""

from __future__ import annotations

import math
import numbers

import torch

from gatednorm.reference import ACTIVATIONS, ROUNDINGS

ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
# gate and weight may differ from x: an fp32 gate or master weight beside bf16 activations, or
# a bf16 gate beside the fp32 output of a Mamba scan. Everything is read into fp32.
_PARAMETER_DTYPES = {torch.bfloat16, torch.float16, torch.float32}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def check_options(*, eps, activation, rounding, zero_centered_gamma, norm_before_gate) -> None:
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    # A chained comparison rather than math.isfinite: under torch.compile(dynamic=True) eps can
    # be a symbolic float, which math functions cannot trace. NaN fails both comparisons.
    if not 0 <= eps < math.inf:
        raise ValueError(f"eps must be a finite number >= 0, got {eps}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    if not isinstance(zero_centered_gamma, bool):
        raise TypeError(f"zero_centered_gamma must be a bool, got {type(zero_centered_gamma).__name__}")
    if not isinstance(norm_before_gate, bool):
        raise TypeError(f"norm_before_gate must be a bool, got {type(norm_before_gate).__name__}")


def check_group_size_type(group_size) -> None:
    if group_size is not None and (isinstance(group_size, bool)
                                   or not isinstance(group_size, numbers.Integral)):
        raise TypeError(f"group_size must be an int or None, got {type(group_size).__name__}")


def check_group_size(group_size, hidden_size: int) -> int:
    """The group size as an int (the whole last dim for None)."""
    if group_size is None:
        return hidden_size
    check_group_size_type(group_size)
    if group_size < 1 or hidden_size % group_size != 0:
        raise ValueError(
            f"group_size must be a positive divisor of the last dim ({hidden_size}), "
            f"got {group_size}")
    return int(group_size)


# The kernels split a row index into its leading-dim coordinates in 32-bit integers.
MAX_KERNEL_ROWS = 2**31 - 1


def check_kernel_rows(x: torch.Tensor) -> None:
    """The fused kernels take at most MAX_KERNEL_ROWS rows (x.numel() / D)."""
    rows = x.numel() // x.shape[-1]
    if rows > MAX_KERNEL_ROWS:
        raise ValueError(
            f"x must have at most {MAX_KERNEL_ROWS} rows (2**31 - 1, the product of its leading "
            f"dims) for the fused kernels, got {rows} for shape {tuple(x.shape)}")


def check_tensors(x, gate, weight, zero_centered_gamma: bool) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not isinstance(gate, torch.Tensor):
        raise TypeError(f"gate must be a torch.Tensor, got {type(gate).__name__}")
    if x.dtype not in ACTIVATION_DTYPES:
        raise TypeError(
            f"x must be bfloat16, float16, float32 or float64, got {_dtype_name(x.dtype)}")
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"x must have shape [..., D] with D >= 1, got {tuple(x.shape)}")
    if gate.shape != x.shape:
        raise ValueError(
            f"gate must have x's shape {tuple(x.shape)}, got {tuple(gate.shape)}")
    allowed_gate = _PARAMETER_DTYPES if x.dtype != torch.float64 else {torch.float64}
    if gate.dtype not in allowed_gate:
        names = " or ".join(sorted(_dtype_name(d) for d in allowed_gate))
        raise TypeError(f"gate must be {names} (x is {_dtype_name(x.dtype)}), "
                        f"got {_dtype_name(gate.dtype)}")
    if gate.device != x.device:
        raise ValueError(f"gate must be on x's device {x.device}, got {gate.device}")
    if weight is None:
        if zero_centered_gamma:
            raise ValueError("zero_centered_gamma=True needs a weight (the scale is 1 + weight)")
        return
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight must be a torch.Tensor or None, got {type(weight).__name__}")
    if weight.shape != (x.shape[-1],):
        raise ValueError(
            f"weight must have shape ({x.shape[-1]},) to match x's last dim, "
            f"got {tuple(weight.shape)}")
    allowed_weight = _PARAMETER_DTYPES if x.dtype != torch.float64 else {torch.float64}
    if weight.dtype not in allowed_weight:
        names = " or ".join(sorted(_dtype_name(d) for d in allowed_weight))
        raise TypeError(f"weight must be {names} (x is {_dtype_name(x.dtype)}), "
                        f"got {_dtype_name(weight.dtype)}")
    if weight.device != x.device:
        raise ValueError(f"weight must be on x's device {x.device}, got {weight.device}")
