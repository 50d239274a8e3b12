"""transformers integration, module by module: describe, from_module, TransformersRMSNormGated.

Every source class that the installed transformers defines is tested against the real class;
the ones it does not define (flash-linear-attention's norms; NemotronHRMSNormGated before
transformers 5.23) against stand-ins written here with the upstream name, package and attribute
layout. Whole tiny models are in test_integrations_models, the conversion check in
test_integrations_checks, the interpreted kernels in test_integrations_interpreted.

Bit-exact checks run on the CPU reference path (rms_norm_gated's eager composite, what CPU users
get), forced by the reference_path fixture even when the suite sets TRITON_INTERPRET=1.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Callable

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from gatednorm import RMSNormGated, functional, ops  # noqa: E402
from gatednorm.kernels import launch  # noqa: E402
from gatednorm import integrations  # noqa: E402
from gatednorm.integrations import convert  # noqa: E402
from gatednorm.integrations.transformers import TransformersRMSNormGated  # noqa: E402


bit_exact = pytest.mark.usefixtures("reference_path")

HIDDEN = 32
EPS = 3e-5  # not any class's default, so that reading the attribute is tested


def _transformers_class(model_dir: str, name: str):
    try:
        module = importlib.import_module(f"transformers.models.{model_dir}.modeling_{model_dir}")
    except ImportError:
        return None
    return getattr(module, name, None)


# --- Stand-ins for classes the installed transformers / environment does not have ----------------

def _nemotron_h_stand_in():
    """NemotronHRMSNormGated: the class a NemotronH-prefixed modular copy of Zamba2RMSNormGated
    would generate (transformers 5.18's Nemotron-H uses Zamba2RMSNormGated itself): Zamba2's
    class under that name and module."""
    zamba2 = _transformers_class("zamba2", "Zamba2RMSNormGated")
    if zamba2 is None:
        return None
    return type("NemotronHRMSNormGated", (zamba2,),
                {"__module__": "transformers.models.nemotron_h.modeling_nemotron_h"})


class FusedRMSNormGated(nn.Module):
    """Stand-in for fla.modules.FusedRMSNormGated (fla-core is not installed): its attributes,
    and its Triton kernel's math in eager fp32 (xhat * w * g * sigmoid(g), stored in x's dtype)."""

    def __init__(self, hidden_size, elementwise_affine=True, eps=1e-5, activation="swish"):
        super().__init__()
        self.hidden_size = hidden_size
        self.elementwise_affine = elementwise_affine
        self.eps = eps
        self.activation = activation
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(hidden_size))
        else:
            self.register_parameter("weight", None)
        self.register_parameter("bias", None)

    def forward(self, x, g, residual=None, prenorm=False, residual_in_fp32=False):
        xf, gf = x.float(), g.float()
        y = xf * (1 / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps))
        if self.weight is not None:
            y = y * self.weight.float()
        if getattr(self, "activation", "swish") in ("swish", "silu"):
            y = y * gf * torch.sigmoid(gf)
        else:
            y = y * torch.sigmoid(gf)
        return y.to(x.dtype)


FusedRMSNormGated.__module__ = "fla.modules.fused_norm_gate"


class FusedRMSNormSwishGate(FusedRMSNormGated):
    """Stand-in for FLA's older swish-only name (no ``activation`` attribute)."""

    def __init__(self, hidden_size, elementwise_affine=True, eps=1e-5):
        super().__init__(hidden_size, elementwise_affine, eps)
        del self.activation


FusedRMSNormSwishGate.__module__ = "fla.modules.fused_norm_gate"


# --- Source classes and what they must map to ----------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Source:
    """A source class, how to build one, and the GatedNormSpec fields it must map to."""

    model_dir: str
    name: str
    build: Callable[[type], nn.Module]
    expected: dict
    stand_in: type | None = None
    variant: str = ""

    @property
    def id(self) -> str:
        return f"{self.name}-{self.variant}" if self.variant else self.name

    def cls(self):
        found = _transformers_class(self.model_dir, self.name) or self.stand_in
        if found is None:
            pytest.skip(f"transformers {transformers.__version__} has no {self.name}")
        return found


def _gate_after(rounding, activation):
    return dict(shape=f"norm-gate-{rounding}", rounding=rounding, activation=activation,
                norm_before_gate=True, group_size=None, gate_optional=False,
                promotes_output=False, squeezes_single_step=False)


def _gate_first(group_size):
    return dict(shape="gate-norm-hf", rounding="hf", activation="silu", norm_before_gate=False,
                group_size=group_size, gate_optional=True, promotes_output=True,
                squeezes_single_step=False)


# Gate-first classes that take group_size (every one from transformers 5.23; only Zamba2's and
# Nemotron-H's before) are built with four groups and must convert grouped; the others
# normalize whole rows.
GROUPED = "groups when the class takes group_size"


def _takes_group_size(cls) -> bool:
    return "group_size" in inspect.signature(cls.__init__).parameters


def _falcon(norm_before_gate):
    # squeezes_single_step depends on the release (checked by test_falcon_h1_shapes).
    return dict(shape="falcon-h1", rounding="fp32", activation="silu",
                norm_before_gate=norm_before_gate, group_size=HIDDEN // 4, gate_optional=True,
                promotes_output=False)


def _plain(cls):
    return cls(HIDDEN, eps=EPS)


def _grouped(cls):
    if _takes_group_size(cls):
        return cls(HIDDEN, group_size=HIDDEN // 4, eps=EPS)
    return cls(HIDDEN, eps=EPS)


def _falcon_build(norm_before_gate):
    return lambda cls: cls(HIDDEN, eps=EPS, n_groups=4, norm_before_gate=norm_before_gate)


SOURCES = [
    Source("qwen3_next", "Qwen3NextRMSNormGated", _plain, _gate_after("hf", "silu")),
    Source("qwen3_5", "Qwen3_5RMSNormGated", _plain, _gate_after("hf", "silu")),
    Source("qwen3_5_moe", "Qwen3_5MoeRMSNormGated", _plain, _gate_after("hf", "silu")),
    Source("olmo_hybrid", "OlmoHybridRMSNormGated", _plain, _gate_after("hf", "silu")),
    Source("qwen4_exp", "Qwen4ExpTextRMSNormGated", _plain, _gate_after("hf", "silu")),
    Source("kimi_linear", "KimiLinearRMSNormGated", _plain, _gate_after("fp32", "sigmoid")),
    Source("glm5_next", "Glm5NextTextRMSNormGated", _plain, _gate_after("fp32", "sigmoid")),
    Source("bailing_hybrid", "BailingHybridRMSNormGated", _plain,
           _gate_after("fp32", "sigmoid")),
    Source("lara_mini", "LaraMiniRMSNormGated", _plain, _gate_after("fp32", "silu")),
    Source("mamba2", "MambaRMSNormGated", _grouped, _gate_first(GROUPED)),
    Source("mamba2", "Mamba2RMSNormGated", _grouped, _gate_first(GROUPED)),
    Source("bamba", "BambaRMSNormGated", _grouped, _gate_first(GROUPED)),
    Source("granitemoehybrid", "GraniteMoeHybridRMSNormGated", _grouped, _gate_first(GROUPED)),
    Source("zamba2", "Zamba2RMSNormGated", _grouped, _gate_first(GROUPED)),
    Source("nemotron_h", "NemotronHRMSNormGated", _grouped, _gate_first(GROUPED),
           stand_in=_nemotron_h_stand_in()),
    Source("falcon_h1", "FalconH1RMSNormGated", _falcon_build(True), _falcon(True),
           variant="norm-gate"),
    Source("falcon_h1", "FalconH1RMSNormGated", _falcon_build(False), _falcon(False),
           variant="gate-norm"),
]
GATE_OPTIONAL = [s for s in SOURCES if s.expected["gate_optional"]]
GATE_REQUIRED = [s for s in SOURCES if not s.expected["gate_optional"]]
FALCON_H1 = [s for s in SOURCES if s.name == "FalconH1RMSNormGated"]


def _source_module(source: Source, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    module = source.build(source.cls()).to(dtype)
    with torch.no_grad():
        module.weight.normal_(1.0, 0.5)  # away from ones, where the roundings coincide
    return module


# x, gate, weight dtypes. "fp32-x" is what the Mamba2-style mixers of a bf16 model pass (an fp32
# scan output, a bf16 gate sliced from the projection); "fp32-weight" is fp32 master weights.
DTYPES = {
    "fp32": (torch.float32, torch.float32, torch.float32),
    "bf16": (torch.bfloat16, torch.bfloat16, torch.bfloat16),
    "fp16": (torch.float16, torch.float16, torch.float16),
    "bf16-fp32-weight": (torch.bfloat16, torch.bfloat16, torch.float32),
    "fp32-x-bf16-gate-weight": (torch.float32, torch.bfloat16, torch.bfloat16),
}


def _inputs(x_dtype, gate_dtype, shape=(2, 3, HIDDEN)):
    torch.manual_seed(1)
    x = (torch.randn(shape) * 2).to(x_dtype)
    # The gate is a strided slice of a wider projection, as every model passes it.
    proj = (torch.randn(*shape[:-1], shape[-1] + 48) * 2).to(gate_dtype)
    return x, proj


def _run(module, x, proj, gate_present=True):
    """y and the gradients of x, the projection holding the gate, and the weight."""
    x = x.detach().clone().requires_grad_()
    proj = proj.detach().clone().requires_grad_()
    module.zero_grad(set_to_none=True)
    y = module(x, proj[..., 16:16 + x.shape[-1]]) if gate_present else module(x)
    torch.manual_seed(2)
    y.backward(torch.randn(y.shape).to(y.dtype))
    return y, x.grad, proj.grad if gate_present else None, module.weight.grad


def assert_bitwise(actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, \
        (actual.dtype, expected.dtype, actual.shape, expected.shape)
    assert torch.equal(actual, expected), (actual.float() - expected.float()).abs().max().item()


# --- convert: describe / from_module -------------------------------------------------------------

@pytest.mark.parametrize("source", SOURCES, ids=lambda s: s.id)
def test_describe_maps_each_class(source):
    module = _source_module(source)
    spec = convert.describe(module)
    expected = dict(source.expected)
    if expected.get("group_size") == GROUPED:
        expected["group_size"] = HIDDEN // 4 if _takes_group_size(type(module)) else None
    assert {k: getattr(spec, k) for k in expected} == expected
    assert spec.eps == EPS and spec.hidden_size == HIDDEN


def test_supported_classes_cover_the_issue_list():
    names = {entry.split(":")[1] for entry in convert.supported_classes()}
    assert {"Qwen3NextRMSNormGated", "Qwen3_5RMSNormGated", "KimiLinearRMSNormGated",
            "MambaRMSNormGated", "NemotronHRMSNormGated", "FalconH1RMSNormGated",
            "Zamba2RMSNormGated", "FusedRMSNormGated"} <= names


@bit_exact
@pytest.mark.parametrize("dtypes", ["fp32", "bf16"])
@pytest.mark.parametrize("source", SOURCES, ids=lambda s: s.id)
def test_from_module_matches_source(source, dtypes):
    x_dtype, gate_dtype, weight_dtype = DTYPES[dtypes]
    src = _source_module(source, weight_dtype)
    new = integrations.from_module(src)
    assert type(new) is RMSNormGated
    assert new.weight is not src.weight and new.weight.data_ptr() != src.weight.data_ptr()
    assert_bitwise(new.weight.detach(), src.weight.detach())
    assert new.weight.requires_grad == src.weight.requires_grad
    x, proj = _inputs(x_dtype, gate_dtype)
    for actual, expected in zip(_run(new, x, proj), _run(src, x, proj)):
        assert_bitwise(actual, expected)


def test_from_module_owns_its_weight():
    source = SOURCES[0]
    src = _source_module(source)
    before = src.weight.detach().clone()
    new = integrations.from_module(src)
    with torch.no_grad():
        new.weight.add_(1.0)
    assert torch.equal(src.weight.detach(), before)


@bit_exact
@pytest.mark.parametrize("dtypes", list(DTYPES))
@pytest.mark.parametrize("source", SOURCES, ids=lambda s: s.id)
def test_drop_in_matches_source(source, dtypes):
    x_dtype, gate_dtype, weight_dtype = DTYPES[dtypes]
    src = _source_module(source, weight_dtype)
    new = TransformersRMSNormGated.from_module(src)
    assert new.variance_epsilon == src.variance_epsilon
    x, proj = _inputs(x_dtype, gate_dtype)
    actual, expected = _run(new, x, proj), _run(src, x, proj)
    wider_weight = torch.promote_types(x_dtype, weight_dtype) != x_dtype
    if new.spec.promotes_output and wider_weight:
        # Documented exception: the source returns the unrounded fp32 product, the drop-in
        # that product rounded to x's dtype (what the mixers' out_proj(y.to(dtype)) sees).
        assert_bitwise(actual[0], expected[0].to(x_dtype).to(expected[0].dtype))
        for a, e in zip(actual[1:], expected[1:]):
            torch.testing.assert_close(a, e, rtol=2 ** -6, atol=2 ** -6 * e.abs().max().item())
        return
    for a, e in zip(actual, expected):
        assert_bitwise(a, e)


@bit_exact
@pytest.mark.parametrize("dtypes", ["fp32", "bf16", "fp32-x-bf16-gate-weight"])
@pytest.mark.parametrize("source", GATE_OPTIONAL, ids=lambda s: s.id)
def test_drop_in_without_gate_is_the_sources_plain_norm(source, dtypes):
    x_dtype, gate_dtype, weight_dtype = DTYPES[dtypes]
    src = _source_module(source, weight_dtype)
    new = TransformersRMSNormGated.from_module(src)
    x, proj = _inputs(x_dtype, gate_dtype)
    for a, e in zip(_run(new, x, proj, gate_present=False), _run(src, x, proj, gate_present=False)):
        if e is not None:
            assert_bitwise(a, e)


@pytest.mark.parametrize("source", GATE_REQUIRED, ids=lambda s: s.id)
def test_drop_in_without_gate_raises_where_the_source_needs_one(source):
    new = TransformersRMSNormGated.from_module(_source_module(source))
    with pytest.raises(TypeError, match="gate=None"):
        new(torch.randn(2, HIDDEN))


@bit_exact
@pytest.mark.parametrize("shape", [(3, HIDDEN), (1, 1, HIDDEN), (3, 1, HIDDEN), (2, 5, HIDDEN)],
                         ids=str)
@pytest.mark.parametrize("source", FALCON_H1, ids=lambda s: s.id)
def test_falcon_h1_shapes(source, shape):
    # FalconH1 accepts [B, D] and [B, S, D] and squeezes a single step [B, 1, D] to [B, D];
    # in the norm-then-gate order it squeezes before gating, so a [B, 1, D] gate broadcasts the
    # result to [B, B, D] (a transformers quirk the replacement keeps: it must not change what
    # the model computes). Its gradients then sum over the broadcast copies after the norm's
    # backward rather than before it: equal up to rounding, not bit for bit.
    src = _source_module(source, torch.bfloat16)
    new = TransformersRMSNormGated.from_module(src)
    x, proj = _inputs(torch.bfloat16, torch.bfloat16, shape)
    actual, expected = _run(new, x, proj), _run(src, x, proj)
    assert_bitwise(actual[0], expected[0])
    for a, e in zip(actual[1:], expected[1:]):
        if expected[0].numel() > x.numel():  # the broadcast case
            torch.testing.assert_close(a, e, rtol=2 ** -7, atol=2 ** -6 * e.abs().max().item())
        else:
            assert_bitwise(a, e)


@bit_exact
@pytest.mark.parametrize("activation", ["swish", "silu", "sigmoid"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fla_stand_in(activation, dtype):
    torch.manual_seed(0)
    src = FusedRMSNormGated(HIDDEN, eps=EPS, activation=activation).to(dtype)
    with torch.no_grad():
        src.weight.normal_(1.0, 0.5)
    spec = convert.describe(src)
    assert (spec.rounding, spec.activation, spec.norm_before_gate, spec.group_size, spec.eps) == \
        ("fp32", "sigmoid" if activation == "sigmoid" else "silu", True, None, EPS)
    new = integrations.from_module(src)
    x, proj = _inputs(dtype, dtype)
    # FLA computes silu as g * sigmoid(g) in its kernel, torch as one op: rounding apart.
    tolerance = 2 ** -7 if dtype == torch.bfloat16 else 1e-5
    for a, e in zip(_run(new, x, proj), _run(src, x, proj)):
        torch.testing.assert_close(a, e, rtol=tolerance, atol=tolerance * e.abs().max().item())


def test_fla_stand_in_layouts():
    swish = convert.describe(FusedRMSNormSwishGate(HIDDEN))
    assert swish.activation == "silu" and swish.rounding == "fp32"
    weightless = integrations.from_module(FusedRMSNormGated(HIDDEN, elementwise_affine=False))
    assert torch.equal(weightless.weight, torch.ones(HIDDEN))
    assert not weightless.weight.requires_grad
    with_bias = FusedRMSNormGated(HIDDEN)
    with_bias.bias = nn.Parameter(torch.zeros(HIDDEN))
    with pytest.raises(convert.UnsupportedModuleError, match="bias"):
        integrations.from_module(with_bias)


def test_unknown_module_error_lists_supported():
    with pytest.raises(convert.UnsupportedModuleError) as error:
        integrations.from_module(nn.LayerNorm(HIDDEN))
    message = str(error.value)
    assert "torch.nn.modules.normalization.LayerNorm" in message
    assert "transformers:Qwen3NextRMSNormGated" in message and "fla:FusedRMSNormGated" in message


def test_same_name_from_another_package_is_judged_by_its_forward():
    # A model's remote code may define MambaRMSNormGated with other numerics (Nemotron-H's calls
    # mamba-ssm's grouped fp32 kernel): a class transformers does not define is converted only
    # if its forward reproduces a known shape; this one has no forward of its own.
    class MambaRMSNormGated(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(HIDDEN))
            self.variance_epsilon = 1e-5
            self.group_size = HIDDEN // 2

    MambaRMSNormGated.__module__ = "transformers_modules.nvidia.modeling_nemotron_h"
    assert not convert.is_supported(MambaRMSNormGated())
    with pytest.raises(convert.UnsupportedModuleError, match="matches no known shape"):
        convert.describe(MambaRMSNormGated())


def test_unexpected_layout_is_an_error():
    source = next(s for s in SOURCES if s.name == "Zamba2RMSNormGated")
    module = _source_module(source)
    module.group_size = 5
    with pytest.raises(convert.UnsupportedModuleError, match="does not divide"):
        convert.describe(module)


@bit_exact
def test_drop_in_compiles_fullgraph():
    source = next(s for s in SOURCES if s.name == "MambaRMSNormGated")
    new = TransformersRMSNormGated.from_module(_source_module(source, torch.bfloat16))
    x, proj = _inputs(torch.float32, torch.bfloat16)
    gate = proj[..., 16:16 + HIDDEN]
    compiled = torch.compile(new, fullgraph=True, backend="aot_eager")
    assert_bitwise(compiled(x, gate), new(x, gate))
