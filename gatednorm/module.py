"""RMSNormGated: the nn.Module around gatednorm.rms_norm_gated."""

from __future__ import annotations

import torch
from torch import nn

from gatednorm.functional import rms_norm_gated
from gatednorm.validation import check_group_size, check_options


class RMSNormGated(nn.Module):
    """Gated RMSNorm with a learned per-channel scale; see :func:`gatednorm.rms_norm_gated`.

    ``forward(x, gate)`` takes x and gate of shape [..., hidden_size] and returns y like x.
    The weight, shape [hidden_size], starts at ones, or at zeros when ``zero_centered_gamma``
    (the effective scale is then ``1 + weight``), so a new module starts as the identity scale.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, *, zero_centered_gamma: bool = False,
                 activation: str = "silu", norm_before_gate: bool = True,
                 group_size: int | None = None, rounding: str = "te", quantize=None,
                 device=None, dtype=None):
        super().__init__()
        if isinstance(hidden_size, bool) or not isinstance(hidden_size, int) or hidden_size < 1:
            raise ValueError(f"hidden_size must be a positive int, got {hidden_size!r}")
        check_options(eps=eps, activation=activation, rounding=rounding,
                      zero_centered_gamma=zero_centered_gamma, norm_before_gate=norm_before_gate)
        check_group_size(group_size, hidden_size)
        self.hidden_size = hidden_size
        self.eps = eps
        self.zero_centered_gamma = zero_centered_gamma
        self.activation = activation
        self.norm_before_gate = norm_before_gate
        self.group_size = group_size
        self.rounding = rounding
        # A gatednorm.quantize format: forward returns a QuantizedOutput.
        self.quantize = quantize
        self.weight = nn.Parameter(torch.empty(hidden_size, device=device, dtype=dtype))
        self.reset_parameters()

    @classmethod
    def from_module(cls, module: nn.Module) -> "RMSNormGated":
        """An equivalent RMSNormGated (same weight, eps, activation, groups, norm order, and
        the rounding that reproduces the source's eager numerics) built from a transformers or
        flash-linear-attention gated-norm module; see gatednorm.integrations.convert."""
        from gatednorm.integrations.convert import from_module

        return from_module(module)

    def reset_parameters(self) -> None:
        with torch.no_grad():
            if self.zero_centered_gamma:
                self.weight.zero_()
            else:
                self.weight.fill_(1.0)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return rms_norm_gated(
            x, gate, self.weight, eps=self.eps, zero_centered_gamma=self.zero_centered_gamma,
            activation=self.activation, norm_before_gate=self.norm_before_gate,
            group_size=self.group_size, rounding=self.rounding, quantize=self.quantize)

    def extra_repr(self) -> str:
        return (f"{self.hidden_size}, eps={self.eps}, zero_centered_gamma={self.zero_centered_gamma}, "
                f"activation={self.activation!r}, norm_before_gate={self.norm_before_gate}, "
                f"group_size={self.group_size}, rounding={self.rounding!r}")
