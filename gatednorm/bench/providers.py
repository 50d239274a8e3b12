"""The implementations timed side by side, and the fp64 oracle they are checked against.

Every provider turns a case into a function ``fn(x, gate, weight) -> y`` called exactly as a
user of that implementation would call it (same strides, no copies added by the benchmark);
:func:`forward_call`, :func:`backward_call` and :func:`forward_backward_call` wrap it into the
zero-argument callables that :mod:`gatednorm.bench.timing` times.

- ``gatednorm``: :func:`gatednorm.rms_norm_gated` as a user calls it outside torch.compile,
  with rounding ``--rounding`` (default ``"te"``).
- ``hf-eager``: the transformers eager formula (Qwen3-Next ``RMSNormGated`` for the gate after
  the norm, Nemotron-H ``MambaRMSNormGated`` for the gate first), as a plain function.
- ``megatron-eager``: Megatron's unfused path as eager ops: TransformerEngine-style RMSNorm in
  fp32 rounded to x's dtype, then the gate applied by a separate pointwise op.
- ``hf-compile``: ``torch.compile(hf-eager formula, dynamic=False)``, compiled afresh per case
  (donated buffers off, so that its backward can run twice through a retained graph).
- ``fla``: flash-linear-attention's fused ``rms_norm_gated`` (norm then gate, one norm per row).
- ``fla-mamba``: flash-linear-attention's Mamba-style ``rmsnorm_fn`` (gate first or grouped).

A provider that cannot express a case reports why (``"n/a"``); one that is not installed is
``"missing"``. Neither is ever silently dropped from the results.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch._functorch.config as functorch_config
import torch.nn.functional as F

import gatednorm
from gatednorm import reference
from gatednorm.bench.cases import Case, Inputs

NormFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
EPS = 1e-6
# FLA's kernels hold a whole row (or group) in one block of at most 64 KB.
FLA_MAX_ROW_BYTES = 65536


@dataclass(frozen=True)
class Options:
    """Settings shared by all providers in one run."""

    eps: float = EPS
    rounding: str = "te"
    compile_backend: str = "inductor"


def _activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    return F.silu if name == "silu" else torch.sigmoid


def _rms_normalize_fp32(h: torch.Tensor, eps: float, group_size: int | None) -> torch.Tensor:
    """h * rsqrt(mean(h^2) + eps) over groups of the last dim; h is fp32."""
    if group_size is None or group_size == h.shape[-1]:
        variance = h.pow(2).mean(-1, keepdim=True)
        return h * torch.rsqrt(variance + eps)
    grouped = h.unflatten(-1, (h.shape[-1] // group_size, group_size))
    variance = grouped.pow(2).mean(-1, keepdim=True)
    return (grouped * torch.rsqrt(variance + eps)).flatten(-2)


def transformers_formula(x, gate, weight, *, eps, activation, norm_before_gate, group_size):
    """transformers eager: fp32 norm rounded to x's dtype, weight applied in x's dtype.

    Gate after the norm (Qwen3-Next ``RMSNormGated``):
    ``R(R(weight * R(xf * rstd)) * act(gate_f))``; gate first (Nemotron-H / Mamba2
    ``MambaRMSNormGated``): ``R(weight * R(norm(xf * act(gate_f))))``.
    """
    act = _activation(activation)
    dtype = x.dtype
    hidden = x.to(torch.float32)
    if not norm_before_gate:
        hidden = hidden * act(gate.to(torch.float32))
    hidden = _rms_normalize_fp32(hidden, eps, group_size)
    hidden = weight * hidden.to(dtype)
    if norm_before_gate:
        hidden = hidden * act(gate.to(torch.float32))
    return hidden.to(dtype)


def megatron_formula(x, gate, weight, *, eps, activation, norm_before_gate, group_size):
    """Megatron unfused: TE-style RMSNorm (fp32 math, one rounding), gate as a pointwise op.

    Gate after the norm: ``R(R(norm(xf) * wf) * act(gate_f))``; gate first:
    ``R(norm(R(xf * act(gate_f))_f) * wf)`` (the gated input materialized in x's dtype).
    """
    act = _activation(activation)
    dtype = x.dtype
    if not norm_before_gate:
        x = (x.float() * act(gate.float())).to(dtype)
    normed = (_rms_normalize_fp32(x.float(), eps, group_size) * weight.float()).to(dtype)
    if not norm_before_gate:
        return normed
    return (normed * act(gate.float())).to(dtype)


def _formula_kwargs(case: Case, options: Options) -> dict:
    return dict(eps=options.eps, activation=case.activation,
                norm_before_gate=case.norm_before_gate, group_size=case.group_size)


def _build_gatednorm(case: Case, options: Options) -> NormFn:
    def fn(x, gate, weight):
        return gatednorm.rms_norm_gated(
            x, gate, weight, eps=options.eps, activation=case.activation,
            norm_before_gate=case.norm_before_gate, group_size=case.group_size,
            rounding=options.rounding)
    return fn


def _build_hf_eager(case: Case, options: Options) -> NormFn:
    return functools.partial(transformers_formula, **_formula_kwargs(case, options))


def _build_megatron_eager(case: Case, options: Options) -> NormFn:
    return functools.partial(megatron_formula, **_formula_kwargs(case, options))


def _build_hf_compile(case: Case, options: Options) -> NormFn:
    # A fresh Dynamo cache per case: no recompile limit is reached across the many shapes of
    # one run, and every case pays (and records) its own compile in its first call.
    torch.compiler.reset()
    # Donated buffers let the compiled backward reuse saved activations' memory, which forbids
    # retain_graph=True: without them the backward can be timed alone like every other
    # provider's. They save memory, not kernel time.
    functorch_config.donated_buffer = False
    kwargs = _formula_kwargs(case, options)

    def formula(x, gate, weight):
        return transformers_formula(x, gate, weight, **kwargs)

    return torch.compile(formula, dynamic=False, backend=options.compile_backend)


@functools.cache
def _fla_api():
    """(rms_norm_gated, rmsnorm_fn, version) from flash-linear-attention, or the import error."""
    try:
        import fla
        from fla.modules.norm.fused_norm_gate import rms_norm_gated
        from fla.modules.norm.layernorm_gated import rmsnorm_fn
    except Exception as error:  # noqa: BLE001 - any import failure means "not usable"
        return None, None, f"{type(error).__name__}: {error}"
    return rms_norm_gated, rmsnorm_fn, getattr(fla, "__version__", "unknown")


def fla_version() -> str | None:
    rms_norm_gated, _, version = _fla_api()
    return version if rms_norm_gated is not None else None


def _fla_missing() -> str | None:
    rms_norm_gated, _, error = _fla_api()
    if rms_norm_gated is not None:
        return None
    return f"not installed: pip install fla-core (import failed: {error})"


def _build_fla(case: Case, options: Options) -> NormFn:
    rms_norm_gated = _fla_api()[0]
    activation = "swish" if case.activation == "silu" else "sigmoid"

    def fn(x, gate, weight):
        return rms_norm_gated(x, gate, weight, None, activation=activation, eps=options.eps)
    return fn


def _build_fla_mamba(case: Case, options: Options) -> NormFn:
    rmsnorm_fn = _fla_api()[1]

    def fn(x, gate, weight):
        return rmsnorm_fn(x, weight, None, z=gate, eps=options.eps, group_size=case.group_size,
                          norm_before_gate=case.norm_before_gate)
    return fn


def _runs_every_case(case: Case) -> str | None:
    return None


def _fla_unsupported(case: Case) -> str | None:
    if not case.norm_before_gate:
        return "gate first is not supported (norm then gate only)"
    if case.group != case.d:
        return "groups are not supported"
    if case.d * case.element_bytes > FLA_MAX_ROW_BYTES:
        return f"rows over {FLA_MAX_ROW_BYTES} bytes are not supported"
    return None


def _fla_mamba_unsupported(case: Case) -> str | None:
    if case.activation != "silu":
        return "only the SiLU gate is supported"
    if case.norm_before_gate and case.group == case.d:
        return "used for gate-first and grouped cases only (fla covers the rest)"
    if case.group * case.element_bytes > FLA_MAX_ROW_BYTES:
        return f"groups over {FLA_MAX_ROW_BYTES} bytes are not supported"
    return None


def _always_available() -> str | None:
    return None


@dataclass(frozen=True)
class Provider:
    """An implementation: ``build`` makes its ``fn(x, gate, weight)`` for a case;
    ``unsupported`` says why it cannot run a case (None if it can); ``missing`` says why it
    is not installed (None if it is)."""

    name: str
    description: str
    build: Callable[[Case, Options], NormFn]
    unsupported: Callable[[Case], str | None]
    missing: Callable[[], str | None]


PROVIDERS = (
    Provider("gatednorm", "gatednorm.rms_norm_gated (fused Triton, eager path)",
             _build_gatednorm, _runs_every_case, _always_available),
    Provider("hf-eager", "transformers eager formula (Qwen3-Next / Nemotron-H RMSNormGated)",
             _build_hf_eager, _runs_every_case, _always_available),
    Provider("megatron-eager", "Megatron unfused: TE-style RMSNorm then a pointwise gate",
             _build_megatron_eager, _runs_every_case, _always_available),
    Provider("hf-compile", "torch.compile(transformers formula, dynamic=False)",
             _build_hf_compile, _runs_every_case, _always_available),
    Provider("fla", "fla.modules.norm.fused_norm_gate.rms_norm_gated",
             _build_fla, _fla_unsupported, _fla_missing),
    Provider("fla-mamba", "fla.modules.norm.layernorm_gated.rmsnorm_fn",
             _build_fla_mamba, _fla_mamba_unsupported, _fla_missing),
)
SUBJECT = "gatednorm"


def select(names: str | None) -> list[Provider]:
    """Providers named in the comma-separated list (all for None), in the canonical order."""
    if not names:
        return list(PROVIDERS)
    wanted = [n for n in names.split(",") if n]
    known = {p.name for p in PROVIDERS}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ValueError(f"unknown provider(s) {unknown}; choose from {sorted(known)}")
    return [p for p in PROVIDERS if p.name in wanted]


def forward_call(fn: NormFn, inputs: Inputs) -> Callable[[], torch.Tensor]:
    """One forward; with training inputs (requires_grad) autograd records the graph, as in
    training, and frees it when the output is dropped."""
    return lambda: fn(inputs.x, inputs.gate, inputs.weight)


def forward_backward_call(fn: NormFn, inputs: Inputs) -> Callable[[], tuple]:
    """One forward then ``torch.autograd.grad`` of (x, gate, weight) for the cotangent dy."""
    def call():
        y = fn(inputs.x, inputs.gate, inputs.weight)
        return torch.autograd.grad(y, inputs.differentiable(), inputs.dy)
    return call


def backward_call(fn: NormFn, inputs: Inputs) -> Callable[[], tuple]:
    """The backward alone: runs the forward once now, keeps its graph (the closure holds y),
    and each call runs ``torch.autograd.grad(..., retain_graph=True)`` through it: every
    provider's whole backward (its kernels, dweight's reduction, and any copies it makes)."""
    y = fn(inputs.x, inputs.gate, inputs.weight)

    def call():
        return torch.autograd.grad(y, inputs.differentiable(), inputs.dy, retain_graph=True)
    return call


@dataclass
class Oracle:
    """fp64 ground truth for one input set: y, and (x, gate, weight) grads for training cases."""

    y: torch.Tensor
    grads: tuple[torch.Tensor, ...] | None


def oracle(case: Case, inputs: Inputs, options: Options) -> Oracle:
    """The fp32-rounding composite (:func:`gatednorm.reference.fp32`) run in float64, where it
    rounds nothing: the exact function every provider approximates."""
    leaves = [t.detach().double().requires_grad_(not case.is_decode)
              for t in inputs.differentiable()]
    with torch.enable_grad():
        y = reference.fp32(*leaves, eps=options.eps, activation=case.activation,
                           norm_before_gate=case.norm_before_gate, group_size=case.group_size)
        grads = None
        if not case.is_decode:
            grads = torch.autograd.grad(y, leaves, inputs.dy.double())
    return Oracle(y=y.detach(), grads=grads)


# Per-dtype tolerances. y: elementwise |err| <= atol + rtol * |ref|, rtol about three
# roundings to the dtype (the "hf" formula rounds three times). Gradients: norm-wise
# ||err|| / ||ref||, looser than y's because dx subtracts two rounded terms.
Y_TOLERANCE = {torch.bfloat16: (1e-5, 1.6e-2), torch.float16: (1e-5, 2e-3),
               torch.float32: (1e-6, 1e-5)}
GRAD_TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 3e-3, torch.float32: 1e-4}


def check(case: Case, truth: Oracle, y: torch.Tensor,
          grads: tuple[torch.Tensor, ...] | None) -> dict:
    """Errors of one provider's outputs against the oracle, and whether they pass.

    Returns ``max_abs_err`` (y), ``tol_ratio`` (worst elementwise error over its tolerance;
    <= 1 passes), ``grad_rel_err`` (worst norm-wise error of dx, dgate, dweight) and
    ``correct``. NaN never passes.
    """
    atol, rtol = Y_TOLERANCE[case.dtype]
    err = (y.detach().double() - truth.y).abs()
    ratio = (err / (atol + rtol * truth.y.abs())).max().item()
    result = {"max_abs_err": err.max().item(), "tol_ratio": ratio,
              "correct": bool(ratio <= 1.0)}
    if grads is not None:
        rels = [((got.double() - want).norm() / want.norm()).item()
                for got, want in zip(grads, truth.grads)]
        worst = math.nan if any(math.isnan(r) for r in rels) else max(rels)
        result["grad_rel_err"] = worst
        result["correct"] = result["correct"] and bool(worst <= GRAD_TOLERANCE[case.dtype])
    return result
