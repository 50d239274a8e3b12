"""rms_norm_gated: validate, pick the path, call it."""

from __future__ import annotations

import torch

from gatednorm import ops, reference
from gatednorm.kernels import launch
from gatednorm.validation import (
    check_group_size,
    check_kernel_rows,
    check_options,
    check_tensors,
)


def _runs_fused(x: torch.Tensor) -> bool:
    if x.dtype == torch.float64:
        return False
    return x.device.type == "cuda" or (ops.INTERPRET and x.device.type == "cpu")


# Argument signatures that passed every check, mapped to what the call then does. At decode
# size the checks cost about as much host time as the kernel launch; a model calls the op
# with a handful of signatures, so each is checked once. A signature holds every property a
# check reads (shapes, dtypes, devices, option values with their exact types), so a call that
# would fail a check never matches one that passed.
_CHECKED: dict[tuple, tuple[bool, int]] = {}
_MAX_CHECKED = 4096


def _signature(x, gate, weight, eps, zero_centered_gamma, activation, norm_before_gate,
               group_size, rounding) -> tuple | None:
    """The call's signature, or None when an argument has another type than the common ones
    (such calls always take the full checks)."""
    if (type(x) is not torch.Tensor or type(gate) is not torch.Tensor
            or type(eps) is not float or type(zero_centered_gamma) is not bool
            or type(norm_before_gate) is not bool or type(activation) is not str
            or type(rounding) is not str
            or not (group_size is None or type(group_size) is int)):
        return None
    if weight is None:
        weight_part = None
    elif isinstance(weight, torch.Tensor):
        weight_part = (weight.shape, weight.dtype, weight.device)
    else:
        return None
    return (x.shape, x.dtype, x.device, gate.shape, gate.dtype, gate.device, weight_part,
            eps, zero_centered_gamma, activation, norm_before_gate, group_size, rounding)


def _needs_grad(x: torch.Tensor, gate: torch.Tensor, weight) -> bool:
    return torch.is_grad_enabled() and (
        x.requires_grad or gate.requires_grad or (weight is not None and weight.requires_grad))


def _check(x, gate, weight, eps, zero_centered_gamma, activation, norm_before_gate,
           group_size, rounding) -> tuple[bool, int]:
    """Every argument check; returns (runs the fused kernels, the group size as an int)."""
    check_options(eps=eps, activation=activation, rounding=rounding,
                  zero_centered_gamma=zero_centered_gamma, norm_before_gate=norm_before_gate)
    check_tensors(x, gate, weight, zero_centered_gamma)
    group = check_group_size(group_size, x.shape[-1])
    fused = _runs_fused(x)
    if fused:
        check_kernel_rows(x)
    return fused, group


def _subclass_rms_norm_gated(x, gate, weight, eps, zero_centered_gamma, activation,
                             norm_before_gate, group_size, rounding):
    """DTensor inputs: checked on their global shapes, then placed by gatednorm.distributed."""
    from gatednorm import distributed

    distributed.check_dtensor_args(x, gate, weight)
    fused, group = _check(x, gate, weight, eps, zero_centered_gamma, activation,
                          norm_before_gate, group_size, rounding)
    return distributed.rms_norm_gated(x, gate, weight, float(eps), zero_centered_gamma,
                                      activation, norm_before_gate, group, rounding, fused=fused)


def rms_norm_gated(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor | None = None, *,
                   eps: float = 1e-6, zero_centered_gamma: bool = False,
                   activation: str = "silu", norm_before_gate: bool = True,
                   group_size: int | None = None, rounding: str = "te") -> torch.Tensor:
    """Gated RMSNorm, fused: ``y = norm(x) * act(gate)`` or ``y = norm(x * act(gate))``.

    ``norm(h) = h / sqrt(mean(h^2) + eps) * gamma`` over each group of ``group_size``
    consecutive elements of the last dim (the whole last dim for None), with
    ``gamma = weight``, ``1 + weight`` when ``zero_centered_gamma``, or 1 without a weight.
    ``act`` is SiLU or sigmoid.

    Args:
        x: [..., D], bfloat16, float16 or float32 (float64 runs the eager reference, for
            gradcheck). Any strides on the leading dims; a non-unit last-dim stride is
            copied once.
        gate: x's shape, in x's dtype or float32. Any strides, as for x (a slice of a
            projection output is read in place).
        weight: [D] in x's dtype or float32, or None.
        eps: added to the mean square, >= 0.
        zero_centered_gamma: scale by ``1 + weight`` (weights initialized at zero).
        activation: ``"silu"`` or ``"sigmoid"``.
        norm_before_gate: True for ``norm(x) * act(gate)`` (Gated DeltaNet, Kimi Linear),
            False for ``norm(x * act(gate))`` (Mamba2, Nemotron-H, Falcon-H1).
        group_size: size of the groups normalized apart; must divide D.
        rounding: where intermediates are rounded to x's dtype, matching a framework:
            ``"te"`` (TransformerEngine / Megatron), ``"fp32"`` (FLA, Mamba, vLLM, SGLang),
            ``"hf"`` (transformers eager modules). See ``gatednorm.reference``.

    Returns:
        y with x's shape and dtype, contiguous. All math is fp32; where 1 + exp(-gate)
        exceeds 2**126 (gate < -87.3) the fused kernels flush the subnormal 1 / (1 + exp(-gate))
        to zero, so act is 0 there rather than about -1e-36. Backward gives dx in x's
        dtype, dgate in the gate's dtype and dweight in the weight's dtype; dweight is
        accumulated in fp32 over a fixed partition of the rows, so its bits do not depend on
        the run or the GPU.

    CUDA tensors run the Triton kernels; CPU tensors run the reference composite, or the
    Triton kernels through the interpreter when ``TRITON_INTERPRET=1`` is set. Under
    ``torch.autocast`` the inputs are taken as given (no cast is inserted).
    """
    if type(x) is not torch.Tensor or type(gate) is not torch.Tensor or (
            weight is not None and type(weight) not in (torch.Tensor, torch.nn.Parameter)):
        return _subclass_rms_norm_gated(x, gate, weight, eps, zero_centered_gamma, activation,
                                        norm_before_gate, group_size, rounding)
    compiling = torch.compiler.is_compiling()
    signature = None if compiling else _signature(
        x, gate, weight, eps, zero_centered_gamma, activation, norm_before_gate, group_size,
        rounding)
    inference = None
    if signature is not None and not _needs_grad(x, gate, weight):
        # A call that needs no gradient, with a signature and strides seen before, is one
        # dictionary lookup away from its launch (a decode step, on a slow host, spends more
        # time here than in the kernel).
        inference = ("inference", signature, x.stride(), gate.stride(),
                     None if weight is None else weight.stride())
        launcher = launch.inference_launcher(inference)
        if launcher is not None:
            return launcher(x, gate, weight)
    checked = _CHECKED.get(signature) if signature is not None else None
    if checked is None:
        checked = _check(x, gate, weight, eps, zero_centered_gamma, activation,
                         norm_before_gate, group_size, rounding)
        if signature is not None:
            if len(_CHECKED) >= _MAX_CHECKED:
                _CHECKED.clear()
            _CHECKED[signature] = checked
    fused, group = checked
    eps = float(eps)

    if not fused:
        return reference.rms_norm_gated(
            x, gate, weight, eps=eps, zero_centered_gamma=zero_centered_gamma,
            activation=activation, norm_before_gate=norm_before_gate, group_size=group,
            rounding=rounding)

    # The kernels need a unit-stride last dim; every other stride is handled in place.
    copied = False
    if x.stride(-1) != 1:
        x, copied = x.contiguous(), True
    if gate.stride(-1) != 1:
        gate, copied = gate.contiguous(), True
    if weight is not None and weight.stride(-1) != 1:
        weight, copied = weight.contiguous(), True

    if compiling:
        y, _ = ops.rms_norm_gated_fwd(x, gate, weight, eps, zero_centered_gamma, activation,
                                      norm_before_gate, group, rounding)
        return y
    if inference is not None and not copied:
        return launch.inference_forward(
            inference, x, gate, weight, eps=eps, zero_centered_gamma=zero_centered_gamma,
            activation=activation, norm_before_gate=norm_before_gate, group_size=group,
            rounding=rounding)
    return ops.eager_rms_norm_gated(x, gate, weight, eps, zero_centered_gamma, activation,
                                    norm_before_gate, group, rounding)
