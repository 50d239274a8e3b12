"""The two ways into the kernels: registered torch.library ops and the eager path.

- ``torch.ops.gatednorm.rms_norm_gated_fwd`` / ``rms_norm_gated_bwd``: registered with
  ``triton_op`` (kernels launched through ``wrap_triton``), differentiable through
  ``register_autograd``. torch.compile traces them with no graph break and Inductor sees the
  Triton kernels; opcheck and CUDA graphs work. Under ``TRITON_INTERPRET=1`` the kernels are
  Python functions that ``wrap_triton`` cannot trace, so the same launchers are registered as
  ``custom_op`` with explicit fake implementations instead.
- :func:`eager`: the same launchers behind a plain ``autograd.Function``
  (:class:`EagerRMSNormGated`), or with no gradient needed a bare launch, used outside
  compilation because the dispatcher boundary of a registered op costs tens of microseconds
  per call, more than the whole kernel at decode sizes.

Host code passes the options as one :class:`~gatednorm.options.GatedNormOptions` with
group_size resolved to an int; only the registered ops' schema spells them out.
"""

from __future__ import annotations

import os

import torch
from torch.library import custom_op, triton_op

from gatednorm.kernels import launch
from gatednorm.options import GatedNormOptions

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def runs_fused(x: torch.Tensor) -> bool:
    """Whether a call with this x runs the Triton kernels (else the reference composite):
    16- and 32-bit x on CUDA, or on CPU under ``TRITON_INTERPRET=1``."""
    if x.dtype == torch.float64:
        return False
    return x.device.type == "cuda" or (INTERPRET and x.device.type == "cpu")


def _forward(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor | None, eps: float,
             zero_centered_gamma: bool, activation: str, norm_before_gate: bool,
             group_size: int, rounding: str) -> tuple[torch.Tensor, torch.Tensor]:
    return launch.forward(
        x, gate, weight, eps=eps, zero_centered_gamma=zero_centered_gamma,
        activation=activation, norm_before_gate=norm_before_gate, group_size=group_size,
        rounding=rounding, traceable=not INTERPRET)


def _backward(dy: torch.Tensor, x: torch.Tensor, gate: torch.Tensor,
              weight: torch.Tensor | None, rstd: torch.Tensor, eps: float,
              zero_centered_gamma: bool, activation: str, norm_before_gate: bool,
              group_size: int, rounding: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return launch.backward(
        dy, x, gate, weight, rstd, eps=eps, zero_centered_gamma=zero_centered_gamma,
        activation=activation, norm_before_gate=norm_before_gate, group_size=group_size,
        rounding=rounding, traceable=not INTERPRET)


def _forward_fake(x, gate, weight, eps, zero_centered_gamma, activation, norm_before_gate,
                  group_size, rounding):
    num_groups = x.shape[-1] // group_size
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
            torch.empty((*x.shape[:-1], num_groups), dtype=torch.float32, device=x.device))


def _backward_fake(dy, x, gate, weight, rstd, eps, zero_centered_gamma, activation,
                   norm_before_gate, group_size, rounding):
    dweight = (torch.empty(0, dtype=x.dtype, device=x.device) if weight is None
               else torch.empty(weight.shape, dtype=weight.dtype, device=weight.device))
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
            torch.empty(gate.shape, dtype=gate.dtype, device=gate.device), dweight)


def _register(name: str, fn, fake):
    if INTERPRET:
        op = custom_op(name, fn, mutates_args=())
        op.register_fake(fake)
        return op
    # triton_op registers fn itself as the fake implementation: it only allocates and
    # launches through wrap_triton, which is a no-op on fake tensors.
    return triton_op(name, fn, mutates_args=())


rms_norm_gated_fwd = _register("gatednorm::rms_norm_gated_fwd", _forward, _forward_fake)
rms_norm_gated_bwd = _register("gatednorm::rms_norm_gated_bwd", _backward, _backward_fake)


def _setup_context(ctx, inputs, output):
    x, gate, weight, *options = inputs
    ctx.save_for_backward(x, gate, weight, output[1])
    ctx.options = GatedNormOptions(*options)


def _op_backward(ctx, dy, _drstd):
    x, gate, weight, rstd = ctx.saved_tensors
    dx, dgate, dweight = rms_norm_gated_bwd(dy, x, gate, weight, rstd,
                                            *ctx.options.op_arguments())
    return (dx, dgate, dweight if weight is not None else None,
            *(None for _ in ctx.options.op_arguments()))


rms_norm_gated_fwd.register_autograd(_op_backward, setup_context=_setup_context)


def registered(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor | None,
               options: GatedNormOptions) -> torch.Tensor:
    """y through the registered op: the path torch.compile traces, and the one tensor
    subclasses (DTensor) take so that their op-level rules apply."""
    y, _ = rms_norm_gated_fwd(x, gate, weight, *options.op_arguments())
    return y


def eager(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor | None,
          options: GatedNormOptions, signature: tuple | None = None) -> torch.Tensor:
    """y on the eager path: the autograd.Function when a gradient is needed, else a launch
    without rstd, remembered under ``signature`` (when given) for
    ``launch.inference_launcher``. ``signature`` must determine everything the launch depends
    on (shapes, strides, dtypes, device, options)."""
    needs_grad = torch.is_grad_enabled() and (
        x.requires_grad or gate.requires_grad or (weight is not None and weight.requires_grad))
    if needs_grad:
        return EagerRMSNormGated.apply(x, gate, weight, options)
    if signature is not None:
        return launch.inference_forward(
            signature, x, gate, weight, eps=options.eps,
            zero_centered_gamma=options.zero_centered_gamma, activation=options.activation,
            norm_before_gate=options.norm_before_gate, group_size=options.group_size,
            rounding=options.rounding)
    y, _ = _launch_forward(x, gate, weight, options, store_rstd=False)
    return y


def _launch_forward(x, gate, weight, options: GatedNormOptions, store_rstd: bool = True):
    return launch.forward(
        x, gate, weight, eps=options.eps, zero_centered_gamma=options.zero_centered_gamma,
        activation=options.activation, norm_before_gate=options.norm_before_gate,
        group_size=options.group_size, rounding=options.rounding, traceable=False,
        store_rstd=store_rstd)


class EagerRMSNormGated(torch.autograd.Function):
    """The launchers behind a plain autograd.Function: the low-overhead eager path.
    ``options`` has its group_size resolved to an int."""

    @staticmethod
    def forward(ctx, x, gate, weight, options: GatedNormOptions):
        y, rstd = _launch_forward(x, gate, weight, options)
        ctx.save_for_backward(x, gate, weight, rstd)
        ctx.options = options
        return y

    @staticmethod
    def backward(ctx, dy):
        x, gate, weight, rstd = ctx.saved_tensors
        options = ctx.options
        dx, dgate, dweight = launch.backward(
            dy, x, gate, weight, rstd, eps=options.eps,
            zero_centered_gamma=options.zero_centered_gamma, activation=options.activation,
            norm_before_gate=options.norm_before_gate, group_size=options.group_size,
            rounding=options.rounding, traceable=False)
        return dx, dgate, (dweight if weight is not None else None), None
