"""rms_norm_gated: the public function; the decode fast path, then the dispatcher."""

from __future__ import annotations

import torch

from gatednorm import dispatch
from gatednorm.kernels import launch


def rms_norm_gated(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor | None = None, *,
                   eps: float = 1e-6, zero_centered_gamma: bool = False,
                   activation: str = "silu", norm_before_gate: bool = True,
                   group_size: int | None = None, rounding: str = "te", quantize=None):
    """Gated RMSNorm, fused: ``y = norm(x) * act(gate)`` or ``y = norm(x * act(gate))``.

    ``norm(h) = h / sqrt(mean(h^2) + eps) * gamma`` over each group of ``group_size``
    consecutive elements of the last dim (the whole last dim for None), with
    ``gamma = weight``, ``1 + weight`` when ``zero_centered_gamma``, or 1 without a weight.
    ``act`` is SiLU or sigmoid.

    Args:
        x: [..., D], bfloat16, float16 or float32 (float64 runs the eager reference, for
            gradcheck). Any strides on the leading dims; a non-unit last-dim stride is
            copied once.
        gate: x's shape, bfloat16, float16 or float32 whatever x's 16- or 32-bit dtype
            (e.g. an fp32 gate beside bf16 x, or a bf16 gate beside fp32 x); float64 when
            x is float64. Any strides, as for x (a slice of a projection output is read in
            place).
        weight: [D] or None; bfloat16, float16 or float32 whatever x's 16- or 32-bit dtype
            (e.g. an fp32 master weight), float64 when x is float64. Every input is read
            into fp32.
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
    torch.compile, and for tensor subclasses such as DTensor, the call goes through the
    registered op ``torch.ops.gatednorm.rms_norm_gated_fwd`` (gatednorm.dispatch). Under
    ``torch.autocast`` the inputs are taken as given (no cast is inserted).

    ``quantize``: None, or an FP8 output format (a name such as ``"1x128"`` or ``"mxfp8"``, or
    a :class:`gatednorm.quantize.Float8Format`): the call then returns a
    :class:`gatednorm.quantize.QuantizedOutput` (data, scales, optional columnwise copies,
    ``dequantize()``), by default exactly the reference quantizer's output for the y above;
    gradients flow through its ``anchor``. See docs/quantized.md.
    """
    raw_options = (eps, zero_centered_gamma, activation, norm_before_gate, group_size, rounding)
    if quantize is not None:
        return dispatch.run_quantized(x, gate, weight, raw_options, quantize)
    key = None if torch.compiler.is_compiling() else dispatch.call_key(x, gate, weight,
                                                                        raw_options)
    if key is not None and not (torch.is_grad_enabled() and (
            x.requires_grad or gate.requires_grad
            or (weight is not None and weight.requires_grad))):
        # A call that needs no gradient, with a key seen before, is one dictionary lookup
        # away from its launch: a decode step, on a slow host, spends more time here than in
        # the kernel. The key holds every property a check reads, so a call that would fail
        # a check never matches one that passed.
        launcher = launch.inference_launcher(key)
        if launcher is not None:
            return launcher(x, gate, weight)
    return dispatch.run(x, gate, weight, raw_options, key)
