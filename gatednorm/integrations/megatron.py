"""The output norm and gate of Megatron-Core's Gated DeltaNet layer, fused.

Megatron's GDN layer (``megatron.core.ssm.gated_delta_net.GatedDeltaNet._apply_gated_norm``)
runs, for ``x`` (the delta-rule output) and ``gate`` (a slice of the input projection), both
[B, S, H, D]::

    y = out_norm(x.reshape(-1, D))               # TransformerEngine RMSNorm, x's dtype
    y = (y * act(gate.reshape(-1, D).float())).to(x.dtype)

with the config's ``layernorm_epsilon`` and ``layernorm_zero_centered_gamma``. That is the
``"te"`` rounding convention of :mod:`gatednorm.reference`: the normalized, scaled value is
rounded to x's dtype before the gate multiplies it, so :func:`gdn_gated_norm` reproduces it
(the same bits on the CPU reference path, within the kernels' 1-ulp contract on CUDA) in one
kernel that reads the strided gate in place.

Nothing here imports Megatron: :meth:`MegatronGatedRMSNorm.from_config` reads a
``TransformerConfig`` by attribute.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gatednorm.functional import rms_norm_gated
from gatednorm.module import RMSNormGated

__all__ = ["MegatronGatedRMSNorm", "gdn_gated_norm"]


def gdn_gated_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5,
                   zero_centered: bool = False, gate_activation: str = "silu") -> torch.Tensor:
    """Megatron GDN's ``act(gate) * out_norm(x)``, fused, with TransformerEngine's rounding.

    Same arguments, in the same order and meaning, as Megatron-Core's own fused output norm
    (``megatron.core.fusions.fused_gated_norm.fused_gated_norm``, enabled by
    ``gdn_gated_output_norm_fusion``), and the same rounding: ``y = R(R(x / sqrt(mean(x^2) +
    eps) * gamma) * act(gate))`` over the last dim, with ``gamma = 1 + weight`` when
    ``zero_centered``, else ``weight``; fp32 math, R = round to x's dtype. In the backward the
    gradient entering the norm, ``dy * act(gate)``, is rounded to x's dtype as well.

    Args:
        x: [B, S, H, D] (or any [..., D]), bfloat16, float16 or float32; any leading strides.
        gate: x's shape, in x's dtype or float32; a strided view of the projection output
            (such as ``qkvzba[..., z_slice].view(B, S, H, D)``) is read in place.
        weight: [D], in x's dtype or float32 (Megatron's ``params_dtype``).
        eps: Megatron's ``config.layernorm_epsilon``.
        zero_centered: Megatron's ``config.layernorm_zero_centered_gamma``.
        gate_activation: ``"silu"`` (GDN) or ``"sigmoid"`` (KDA).

    Returns:
        y with x's shape and dtype. Backward follows the unfused graph (``"te"`` in
        :mod:`gatednorm.reference`): dx in x's dtype, dgate in the gate's dtype, dweight in the
        weight's dtype, accumulated in fp32 in a fixed order (deterministic).
    """
    return rms_norm_gated(x, gate, weight, eps=eps, zero_centered_gamma=zero_centered,
                          activation=gate_activation, norm_before_gate=True, rounding="te")


def _activation_name(activation_func) -> str:
    # By name, as GDN itself does (``self.activation = self.act_fn.__name__``).
    name = getattr(activation_func, "__name__", None)
    if name in ("silu", "swish"):
        return "silu"
    if name == "sigmoid":
        return "sigmoid"
    raise ValueError(f"the GDN gate activation must be silu or sigmoid, got {activation_func!r}")


class MegatronGatedRMSNorm(RMSNormGated):
    """Module form of :func:`gdn_gated_norm`: ``forward(x, gate)`` replaces GDN's
    ``out_norm(x)`` followed by the gate multiply.

    The weight, shape [hidden_size] (GDN's value head dim), starts at zeros with
    ``zero_centered_gamma`` and at ones otherwise, like TransformerEngine's RMSNorm; its
    state_dict key is ``weight``, as TE's, so ``out_norm.weight`` checkpoints load unchanged.
    ``weight.sequence_parallel`` is set to ``sequence_parallel``, the attribute Megatron reads
    to all-reduce layernorm gradients across tensor-parallel ranks under sequence parallelism.
    The attribute lives on the Parameter object: ``.to()`` and ``load_state_dict`` keep it,
    replacing the Parameter (``load_state_dict(assign=True)``, ``to_empty``) does not.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-5, zero_centered_gamma: bool = False,
                 sequence_parallel: bool = False, *, activation: str = "silu", device=None,
                 dtype=None):
        super().__init__(hidden_size, eps, zero_centered_gamma=zero_centered_gamma,
                         activation=activation, norm_before_gate=True, group_size=None,
                         rounding="te", device=device, dtype=dtype)
        self.sequence_parallel = bool(sequence_parallel)
        self.weight.sequence_parallel = self.sequence_parallel

    @classmethod
    def from_config(cls, config, hidden_size: int, eps: float | None = None,
                    device=None) -> "MegatronGatedRMSNorm":
        """Built from a Megatron ``TransformerConfig`` as GDN builds its ``out_norm``:
        ``layernorm_epsilon`` (unless ``eps`` is given), ``layernorm_zero_centered_gamma``,
        ``sequence_parallel``, ``params_dtype`` and ``activation_func``. ``device`` defaults to
        the current CUDA device when CUDA is available, as Megatron places its parameters."""
        if device is None and torch.cuda.is_available():
            device = torch.cuda.current_device()
        zero_centered_gamma = bool(getattr(config, "layernorm_zero_centered_gamma", False))
        return cls(hidden_size, config.layernorm_epsilon if eps is None else eps,
                   zero_centered_gamma=zero_centered_gamma,
                   sequence_parallel=bool(getattr(config, "sequence_parallel", False)),
                   activation=_activation_name(getattr(config, "activation_func", F.silu)),
                   device=device, dtype=getattr(config, "params_dtype", None))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, sequence_parallel={self.sequence_parallel}"
