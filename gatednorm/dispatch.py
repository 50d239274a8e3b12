"""Which way a checked call goes: the reference composite, the registered op or the eager path.

Exits of :func:`run`, in order:

1. ``reference``: float64 inputs (gradcheck) and devices the kernels do not run on (CPU
   without ``TRITON_INTERPRET=1``, meta) run :func:`gatednorm.reference.rms_norm_gated`.
2. ``registered op``: under torch.compile, and for tensor subclasses (any
   ``type(t) is not torch.Tensor``), ``torch.ops.gatednorm.rms_norm_gated_fwd``, so that
   the compiler traces it and a subclass's op-level rules apply. DTensors go through
   :func:`gatednorm.distributed.rms_norm_gated`: the registered op with its sharding rules
   where the kernels run, the reference composite on each rank's shards elsewhere.
3. ``eager``: everything else, :func:`gatednorm.ops.eager`.

A call with ``quantize`` (an FP8 output) takes :func:`run_quantized` instead, with the same
checks: the fused quantizing kernel, or the reference composite and the reference quantizer
where the kernels do not run (gatednorm.quantize).
"""

from __future__ import annotations

import torch

from gatednorm import ops, reference
from gatednorm.kernels import launch
from gatednorm.options import GatedNormOptions
from gatednorm.validation import check_kernel_rows, check_tensors

_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def call_key(x, gate, weight, raw_options: tuple) -> tuple | None:
    """Everything a check or a launch reads from a call (shapes, strides, dtypes, devices,
    the option values with their exact types), or None when a tensor is a subclass or an
    argument has another type than the common ones (such calls always take the full checks).
    A call that would fail a check never matches the key of one that passed."""
    if type(x) is not torch.Tensor or type(gate) is not torch.Tensor:
        return None
    eps, zero_centered_gamma, activation, norm_before_gate, group_size, rounding = raw_options
    if (type(eps) is not float or type(zero_centered_gamma) is not bool
            or type(norm_before_gate) is not bool or type(activation) is not str
            or type(rounding) is not str
            or not (group_size is None or type(group_size) is int)):
        return None
    if weight is None:
        weight_part = None
    elif type(weight) in _PLAIN_TYPES:
        weight_part = (weight.shape, weight.stride(), weight.dtype, weight.device)
    else:
        return None
    return (x.shape, x.stride(), x.dtype, x.device, gate.shape, gate.stride(), gate.dtype,
            gate.device, weight_part, raw_options)


def _has_subclass(x, gate, weight) -> bool:
    return (type(x) is not torch.Tensor or type(gate) is not torch.Tensor
            or (weight is not None and type(weight) not in _PLAIN_TYPES))


def _check(x, gate, weight, raw_options: tuple) -> tuple[GatedNormOptions, bool]:
    """Every argument check; returns (the options with group_size resolved, whether the
    call runs the fused kernels). Reads only what a DTensor also answers (types, shapes,
    dtypes, devices)."""
    options = GatedNormOptions.checked(*raw_options)
    check_tensors(x, gate, weight, options.zero_centered_gamma)
    options = options.for_hidden_size(x.shape[-1])
    fused = ops.runs_fused(x)
    if fused:
        check_kernel_rows(x)
    return options, fused


def run(x, gate, weight, raw_options: tuple, key: tuple | None) -> torch.Tensor:
    """y of a call: checked (once per ``key``, in ``launch.cached``), then one of the three
    exits. ``raw_options`` are the six option values as the caller gave them, in
    GatedNormOptions' order; ``key`` is :func:`call_key` of the call, or None."""
    if key is None and _has_subclass(x, gate, weight):
        # Imported here: torch.distributed.tensor loads only in programs with tensor subclasses.
        from gatednorm import distributed

        if distributed.dtensor_call(x, gate, weight):
            options, fused = _check(x, gate, weight, raw_options)
            return distributed.rms_norm_gated(x, gate, weight, options, fused=fused)
    if key is None:
        options, fused = _check(x, gate, weight, raw_options)
    else:
        options, fused = launch.cached(("checked", key),
                                       lambda: _check(x, gate, weight, raw_options))
    if not fused:
        o = options
        return reference.rms_norm_gated(
            x, gate, weight, eps=o.eps, zero_centered_gamma=o.zero_centered_gamma,
            activation=o.activation, norm_before_gate=o.norm_before_gate,
            group_size=o.group_size, rounding=o.rounding)

    # The kernels need a unit-stride last dim; every other stride is handled in place.
    copied = False
    if x.stride(-1) != 1:
        x, copied = x.contiguous(), True
    if gate.stride(-1) != 1:
        gate, copied = gate.contiguous(), True
    if weight is not None and weight.stride(-1) != 1:
        weight, copied = weight.contiguous(), True

    if key is None and (torch.compiler.is_compiling() or _has_subclass(x, gate, weight)):
        return ops.registered(x, gate, weight, options)
    return ops.eager(x, gate, weight, options, None if copied else key)


def run_quantized(x, gate, weight, raw_options: tuple, quantize):
    """A :class:`gatednorm.quantize.QuantizedOutput` of the call, checked as :func:`run`'s."""
    if type(x) is not torch.Tensor or type(gate) is not torch.Tensor or (
            weight is not None and type(weight) not in _PLAIN_TYPES):
        raise TypeError(
            "quantize: the FP8 output takes plain tensors for x, gate and weight, got "
            f"{type(x).__name__}, {type(gate).__name__} and {type(weight).__name__} (for "
            "DTensor inputs, quantize each rank's local tensors: x.to_local())")
    options, fused = _check(x, gate, weight, raw_options)
    # Imported here: the quantized kernels compile only for programs that use them.
    from gatednorm.quantize.api import quantized_output

    return quantized_output(x, gate, weight, options, quantize, fused)
