"""RMSNormGated: the nn.Module around gatednorm.rms_norm_gated."""

from __future__ import annotations

import torch
from torch import nn

from gatednorm.functional import rms_norm_gated
from gatednorm.options import GatedNormOptions


class RMSNormGated(nn.Module):
    """Gated RMSNorm with a learned per-channel scale; see :func:`gatednorm.rms_norm_gated`.

    ``forward(x, gate)`` takes x and gate of shape [..., hidden_size] and returns y like x.
    The weight, shape [hidden_size], starts at ones, or at zeros when ``zero_centered_gamma``
    (the effective scale is then ``1 + weight``), so a new module starts as the identity scale.
    With ``quantize`` (an FP8 format, see :func:`gatednorm.rms_norm_gated`) forward returns a
    :class:`gatednorm.quantize.QuantizedOutput` instead of y.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, *, zero_centered_gamma: bool = False,
                 activation: str = "silu", norm_before_gate: bool = True,
                 group_size: int | None = None, rounding: str = "te", quantize=None,
                 device=None, dtype=None):
        super().__init__()
        if isinstance(hidden_size, bool) or not isinstance(hidden_size, int) or hidden_size < 1:
            raise ValueError(f"hidden_size must be a positive int, got {hidden_size!r}")
        options = GatedNormOptions.checked(
            eps=eps, zero_centered_gamma=zero_centered_gamma, activation=activation,
            norm_before_gate=norm_before_gate, group_size=group_size, rounding=rounding)
        options.for_hidden_size(hidden_size)  # raises unless group_size divides hidden_size
        self.hidden_size = hidden_size
        # One validated value; eps, activation, ... below read from it and are read-only.
        self.options = options
        if quantize is not None:
            from gatednorm.quantize import as_format

            as_format(quantize)  # an unknown format fails here, not at the first forward
        # An FP8 output format (gatednorm.quantize): forward returns a QuantizedOutput.
        self.quantize = quantize
        self.weight = nn.Parameter(torch.empty(hidden_size, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            if self.zero_centered_gamma:
                self.weight.zero_()
            else:
                self.weight.fill_(1.0)

    eps = property(lambda self: self.options.eps)
    zero_centered_gamma = property(lambda self: self.options.zero_centered_gamma)
    activation = property(lambda self: self.options.activation)
    norm_before_gate = property(lambda self: self.options.norm_before_gate)
    group_size = property(lambda self: self.options.group_size)
    rounding = property(lambda self: self.options.rounding)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        options = self.options
        return rms_norm_gated(
            x, gate, self.weight, eps=options.eps,
            zero_centered_gamma=options.zero_centered_gamma, activation=options.activation,
            norm_before_gate=options.norm_before_gate, group_size=options.group_size,
            rounding=options.rounding, quantize=self.quantize)

    def extra_repr(self) -> str:
        return (f"{self.hidden_size}, eps={self.eps}, zero_centered_gamma={self.zero_centered_gamma}, "
                f"activation={self.activation!r}, norm_before_gate={self.norm_before_gate}, "
                f"group_size={self.group_size}, rounding={self.rounding!r}"
                + (f", quantize={self.quantize!r}" if self.quantize is not None else ""))
