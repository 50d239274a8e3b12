"""transformers integration: convert.from_module, TransformersRMSNormGated, patch / unpatch.

Every source class that the installed transformers defines is tested against the real class;
the ones it does not define (NemotronHRMSNormGated, flash-linear-attention's norms) against
stand-ins written here with the upstream name, package and attribute layout. Whole tiny models
(hidden 64, 2 layers, vocab 128, random init from a config: no download) of every supported
family run forward, backward and greedy generation with and without the patch.

Bit-exact checks run on the CPU reference path (rms_norm_gated's eager composite, what CPU users
get), forced by the reference_path fixture even when the suite sets TRITON_INTERPRET=1. The Triton
kernels are checked with tolerances: in a subprocess with TRITON_INTERPRET=1 against each source
module, and in process on whole patched models when the suite runs with the interpreter.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import textwrap
import warnings
from typing import Callable

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from conftest import run_interpreted  # noqa: E402
from gatednorm import RMSNormGated, ops  # noqa: E402
from gatednorm.integrations import convert  # noqa: E402
from gatednorm.integrations import transformers as gn_transformers  # noqa: E402
from gatednorm.integrations.transformers import TransformersRMSNormGated  # noqa: E402


@pytest.fixture
def reference_path(monkeypatch):
    """CPU tensors run the eager reference composite, what a CPU user gets without
    TRITON_INTERPRET, also in a run that set TRITON_INTERPRET=1 for the kernel tests."""
    monkeypatch.setattr(ops, "INTERPRET", False)


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
        found = self.stand_in or _transformers_class(self.model_dir, self.name)
        if found is None:
            pytest.skip(f"transformers {transformers.__version__} has no {self.name}")
        return found


def _gate_after(rounding, activation):
    return dict(rounding=rounding, activation=activation, norm_before_gate=True, group_size=None,
                gate_optional=False, promotes_output=False, squeezes_single_step=False)


def _gate_first(group_size):
    return dict(rounding="hf", activation="silu", norm_before_gate=False, group_size=group_size,
                gate_optional=True, promotes_output=True, squeezes_single_step=False)


def _falcon(norm_before_gate):
    return dict(rounding="fp32", activation="silu", norm_before_gate=norm_before_gate,
                group_size=HIDDEN // 4, gate_optional=True, promotes_output=False,
                squeezes_single_step=True)


def _plain(cls):
    return cls(HIDDEN, eps=EPS)


def _grouped(cls):
    return cls(HIDDEN, group_size=HIDDEN // 4, eps=EPS)


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
    Source("mamba2", "MambaRMSNormGated", _plain, _gate_first(None)),
    Source("bamba", "BambaRMSNormGated", _plain, _gate_first(None)),
    Source("granitemoehybrid", "GraniteMoeHybridRMSNormGated", _plain, _gate_first(None)),
    Source("zamba2", "Zamba2RMSNormGated", _grouped, _gate_first(HIDDEN // 4)),
    Source("nemotron_h", "NemotronHRMSNormGated", _grouped, _gate_first(HIDDEN // 4),
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
    spec = convert.describe(_source_module(source))
    assert {k: getattr(spec, k) for k in source.expected} == source.expected
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
    new = RMSNormGated.from_module(src)
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
    new = RMSNormGated.from_module(src)
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
    new = RMSNormGated.from_module(src)
    x, proj = _inputs(dtype, dtype)
    # FLA computes silu as g * sigmoid(g) in its kernel, torch as one op: rounding apart.
    tolerance = 2 ** -7 if dtype == torch.bfloat16 else 1e-5
    for a, e in zip(_run(new, x, proj), _run(src, x, proj)):
        torch.testing.assert_close(a, e, rtol=tolerance, atol=tolerance * e.abs().max().item())


def test_fla_stand_in_layouts():
    swish = convert.describe(FusedRMSNormSwishGate(HIDDEN))
    assert swish.activation == "silu" and swish.rounding == "fp32"
    weightless = RMSNormGated.from_module(FusedRMSNormGated(HIDDEN, elementwise_affine=False))
    assert torch.equal(weightless.weight, torch.ones(HIDDEN))
    assert not weightless.weight.requires_grad
    with_bias = FusedRMSNormGated(HIDDEN)
    with_bias.bias = nn.Parameter(torch.zeros(HIDDEN))
    with pytest.raises(convert.UnsupportedModuleError, match="bias"):
        RMSNormGated.from_module(with_bias)


def test_unknown_module_error_lists_supported():
    with pytest.raises(convert.UnsupportedModuleError) as error:
        RMSNormGated.from_module(nn.LayerNorm(HIDDEN))
    message = str(error.value)
    assert "torch.nn.modules.normalization.LayerNorm" in message
    assert "transformers:Qwen3NextRMSNormGated" in message and "fla:FusedRMSNormGated" in message


def test_same_name_from_another_package_is_not_assumed():
    # A model's remote code may define MambaRMSNormGated with other numerics (Nemotron-H's calls
    # mamba-ssm's grouped fp32 kernel): only the class that transformers defines is trusted.
    class MambaRMSNormGated(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(HIDDEN))
            self.variance_epsilon = 1e-5
            self.group_size = HIDDEN // 2

    MambaRMSNormGated.__module__ = "transformers_modules.nvidia.modeling_nemotron_h"
    with pytest.raises(convert.UnsupportedModuleError, match="not a supported gated norm"):
        convert.describe(MambaRMSNormGated())


def test_unexpected_layout_is_an_error():
    source = next(s for s in SOURCES if s.name == "Zamba2RMSNormGated")
    module = _source_module(source)
    module.group_size = 5
    with pytest.raises(convert.UnsupportedModuleError, match="does not divide"):
        convert.describe(module)


# --- Whole tiny models ---------------------------------------------------------------------------

VOCAB = 128


def _qwen3_next():
    return "Qwen3NextForCausalLM", dict(
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=4, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        num_experts=4, num_experts_per_tok=2, intermediate_size=128,
        layer_types=["linear_attention", "full_attention"])


def _qwen3_5():
    return "Qwen3_5ForCausalLM", dict(
        config_class="Qwen3_5TextConfig", num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=4, intermediate_size=128,
        layer_types=["linear_attention", "full_attention"])


def _mamba2():
    return "Mamba2ForCausalLM", dict(num_heads=8, head_dim=16, state_size=16, n_groups=2,
                                     expand=2, chunk_size=8)


def _nemotron_h():
    return "NemotronHForCausalLM", dict(
        layers_block_type=["mamba", "attention"], num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=128, ssm_state_size=16, mamba_num_heads=8,
        mamba_head_dim=16, n_groups=2, chunk_size=8)


def _falcon_h1(norm_before_gate):
    return "FalconH1ForCausalLM", dict(
        intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, mamba_d_ssm=128,
        mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16,
        mamba_chunk_size=8, mamba_rms_norm=True, mamba_norm_before_gate=norm_before_gate)


def _zamba2():
    return "Zamba2ForCausalLM", dict(
        layers_block_type=["mamba", "hybrid"], mamba_d_state=16, n_mamba_heads=8,
        mamba_ngroups=2, num_attention_heads=4, num_key_value_heads=4, intermediate_size=128,
        chunk_size=8, adapter_rank=8)


def _kimi_linear():
    return "KimiLinearForCausalLM", dict(
        intermediate_size=128, moe_intermediate_size=32, num_attention_heads=4,
        num_key_value_heads=4, kv_lora_rank=16, qk_rope_head_dim=8, v_head_dim=16,
        qk_nope_head_dim=8, num_local_experts=4, num_experts_per_tok=2, linear_head_dim=16,
        linear_num_heads=4, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        layer_types=["linear_attention", "full_attention"])


FAMILIES = {
    "qwen3_next": _qwen3_next,
    "qwen3_5": _qwen3_5,
    "mamba2": _mamba2,
    "nemotron_h": _nemotron_h,
    "falcon_h1-gate-norm": lambda: _falcon_h1(False),
    "falcon_h1-norm-gate": lambda: _falcon_h1(True),
    "zamba2": _zamba2,
    "kimi_linear": _kimi_linear,
}


def _tiny_model(family: str, dtype: torch.dtype) -> nn.Module:
    model_name, options = FAMILIES[family]()
    model_cls = getattr(transformers, model_name, None)
    if model_cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {model_name}")
    options = dict(options)
    config_cls = getattr(transformers, options.pop("config_class", ""), None)
    config_cls = config_cls or model_cls.config_class
    config = config_cls(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, **options)
    torch.manual_seed(0)
    model = model_cls(config).to(dtype)
    with torch.no_grad():
        # Norm weights away from ones, where the rounding conventions coincide.
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.normal_(1.0, 0.5)
    return model


def _patched_copy(model):
    patched = copy.deepcopy(model)
    names = gn_transformers.patch(patched)
    assert names, "the family has gated norms; patch must find them"
    calls = []
    for name in names:
        module = patched.get_submodule(name)
        assert isinstance(module, TransformersRMSNormGated)
        module.register_forward_hook(lambda *_: calls.append(None))
    return patched, names, calls


def _forward_backward(model, ids):
    model.zero_grad(set_to_none=True)
    out = model(ids, labels=ids, use_cache=False)
    out.loss.backward()
    return out.logits, {name: p.grad for name, p in model.named_parameters()}


@bit_exact
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_patched_model_forward_backward_bit_identical(family, dtype):
    model = _tiny_model(family, dtype)
    patched, names, calls = _patched_copy(model)
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))
    logits, grads = _forward_backward(model, ids)
    patched_logits, patched_grads = _forward_backward(patched, ids)
    assert len(calls) == len(names), "every replacement must have run"
    assert_bitwise(patched_logits, logits)
    assert patched_grads.keys() == grads.keys()
    for name, grad in grads.items():
        if grad is None:
            assert patched_grads[name] is None, name
        else:
            assert_bitwise(patched_grads[name], grad)
    for name in names:
        assert grads[f"{name}.weight"] is not None


@bit_exact
@pytest.mark.parametrize("family", list(FAMILIES))
def test_patched_model_generates_identically(family):
    # Greedy decoding with the cache: the single-token paths (Mamba2-style mixers pass
    # [B, 1, D] in the activation dtype; FalconH1 squeezes it) go through the replacements.
    model = _tiny_model(family, torch.bfloat16).eval()
    patched, _, calls = _patched_copy(model)
    ids = torch.randint(3, VOCAB, (2, 5), generator=torch.Generator().manual_seed(4))
    kwargs = dict(max_new_tokens=3, do_sample=False, output_scores=True,
                  return_dict_in_generate=True, pad_token_id=0)
    expected = model.generate(ids, **kwargs)
    actual = patched.generate(ids, **kwargs)
    assert calls
    assert torch.equal(actual.sequences, expected.sequences)
    for a, e in zip(actual.scores, expected.scores, strict=True):
        assert_bitwise(a, e)


@pytest.mark.skipif(not ops.INTERPRET, reason="runs the Triton kernels on CPU: needs "
                    "TRITON_INTERPRET=1 before import (tests/conftest.py sets it by default)")
@pytest.mark.parametrize("family", list(FAMILIES))
def test_patched_model_through_interpreted_kernels(family):
    # fp32, where the kernels differ from the eager composite only in reduction order (about
    # 1e-7 relative); through two layers and back that stays near 1e-6. bf16 is left to the
    # module-level checks: one flipped bf16 rounding can flip a MoE routing decision.
    model = _tiny_model(family, torch.float32)
    patched, names, calls = _patched_copy(model)
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))
    logits, grads = _forward_backward(model, ids)
    patched_logits, patched_grads = _forward_backward(patched, ids)
    assert len(calls) == len(names)
    torch.testing.assert_close(patched_logits, logits, rtol=0,
                               atol=1e-5 * logits.abs().max().item())
    for name, grad in grads.items():
        if grad is not None:
            torch.testing.assert_close(patched_grads[name], grad, rtol=0,
                                       atol=1e-4 * grad.abs().max().item(), msg=name)


# --- patch / unpatch mechanics -------------------------------------------------------------------

def test_patch_keeps_parameters_and_state_dict():
    model = _tiny_model("qwen3_next", torch.bfloat16)
    before = model.state_dict()
    parameters = dict(model.named_parameters())
    names = gn_transformers.patch(model)
    assert names == ["model.layers.0.linear_attn.norm"]
    after = model.state_dict()
    assert list(after) == list(before)
    for key in before:
        assert after[key] is before[key] or torch.equal(after[key], before[key])
    # The replacement adopts the Parameter object: optimizers built before patch keep working.
    assert model.get_submodule(names[0]).weight is parameters[f"{names[0]}.weight"]
    fresh = _tiny_model("qwen3_next", torch.bfloat16)
    fresh.load_state_dict(model.state_dict(), strict=True)
    model.load_state_dict(fresh.state_dict(), strict=True)


def test_patch_leaves_other_modules_and_instances_alone():
    model = _tiny_model("qwen3_next", torch.float32)
    other = _tiny_model("qwen3_next", torch.float32)
    source = model.get_submodule("model.layers.0.linear_attn.norm")
    source_cls = type(source)
    plain_norms = {name: m for name, m in model.named_modules()
                   if type(m).__name__ == "Qwen3NextRMSNorm"}
    class_forward = source_cls.forward
    gn_transformers.patch(model)
    assert source_cls.forward is class_forward
    assert type(other.get_submodule("model.layers.0.linear_attn.norm")) is source_cls
    for name, module in plain_norms.items():
        assert model.get_submodule(name) is module
    assert gn_transformers.patch(model) == []  # idempotent


@bit_exact
def test_unpatch_restores_originals_with_trained_weights():
    model = _tiny_model("mamba2", torch.float32)
    originals = {name: m for name, m in model.named_modules()
                 if type(m).__name__ == "MambaRMSNormGated"}
    names = gn_transformers.patch(model)
    assert sorted(names) == sorted(originals)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(5))
    model(ids, labels=ids, use_cache=False).loss.backward()
    optimizer.step()
    trained = {name: model.get_submodule(name).weight for name in names}
    logits = model(ids, use_cache=False).logits
    assert gn_transformers.unpatch(model) == names
    for name in names:
        assert model.get_submodule(name) is originals[name]
        assert model.get_submodule(name).weight is trained[name]
    assert_bitwise(model(ids, use_cache=False).logits, logits)
    assert gn_transformers.unpatch(model) == []


def test_patch_follows_dtype_conversion_and_training_mode():
    model = _tiny_model("zamba2", torch.float32).eval()
    names = gn_transformers.patch(model)
    assert all(not model.get_submodule(name).training for name in names)
    model.to(torch.bfloat16)
    assert all(model.get_submodule(name).weight.dtype == torch.bfloat16 for name in names)
    ids = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(6))
    model(ids, use_cache=False)
    gn_transformers.unpatch(model)
    assert all(model.get_submodule(name).weight.dtype == torch.bfloat16 for name in names)


@bit_exact
def test_from_pretrained_round_trip(tmp_path):
    model = _tiny_model("falcon_h1-gate-norm", torch.float32)
    gn_transformers.patch(model)
    model.save_pretrained(tmp_path)  # saved while patched: same keys as unpatched
    loaded = type(model).from_pretrained(tmp_path)
    unpatched_keys = set(_tiny_model("falcon_h1-gate-norm", torch.float32).state_dict())
    assert set(loaded.state_dict()) == unpatched_keys
    patched = copy.deepcopy(loaded)
    assert gn_transformers.patch(patched)
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(7))
    assert_bitwise(patched(ids, use_cache=False).logits, loaded(ids, use_cache=False).logits)


def test_shared_module_gets_one_replacement():
    source = _source_module(SOURCES[0])
    holder = nn.Module()
    holder.a = source
    holder.b = nn.Sequential(source)
    names = gn_transformers.patch(holder)
    assert names == ["a", "b.0"]
    assert holder.a is holder.b[0] and isinstance(holder.a, TransformersRMSNormGated)
    assert gn_transformers.unpatch(holder) == ["a", "b.0"]
    assert holder.a is source and holder.b[0] is source


def test_patch_warns_about_what_it_leaves_or_drops():
    class ToyRMSNormGated(nn.Module):
        pass

    holder = nn.Module()
    holder.toy = ToyRMSNormGated()
    holder.fla = FusedRMSNormGated(HIDDEN)
    holder.hooked = _source_module(SOURCES[0])
    holder.hooked.register_forward_hook(lambda *_: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert gn_transformers.patch(holder) == ["hooked"]
    messages = " ".join(str(w.message) for w in caught)
    assert "ToyRMSNormGated" in messages and "FusedRMSNormGated" in messages
    assert "hooks" in messages and "hooked" in messages


@bit_exact
def test_drop_in_compiles_fullgraph():
    source = next(s for s in SOURCES if s.name == "MambaRMSNormGated")
    new = TransformersRMSNormGated.from_module(_source_module(source, torch.bfloat16))
    x, proj = _inputs(torch.float32, torch.bfloat16)
    gate = proj[..., 16:16 + HIDDEN]
    compiled = torch.compile(new, fullgraph=True, backend="aot_eager")
    assert_bitwise(compiled(x, gate), new(x, gate))


# --- The Triton kernels, through the interpreter, against the sources ----------------------------

INTERPRETED_CHECK = textwrap.dedent("""
    import importlib, torch
    import gatednorm
    from gatednorm import ops, reference
    from gatednorm.integrations.transformers import TransformersRMSNormGated
    assert ops.INTERPRET

    def forbidden(*args, **kwargs):
        raise AssertionError("the reference composite ran instead of the kernels")
    reference.rms_norm_gated = forbidden

    def cls(model_dir, name):
        module = importlib.import_module(f"transformers.models.{model_dir}.modeling_{model_dir}")
        return getattr(module, name)

    D = 32
    sources = {
        "qwen3_next": lambda: cls("qwen3_next", "Qwen3NextRMSNormGated")(D, eps=3e-5),
        "kimi_linear": lambda: cls("kimi_linear", "KimiLinearRMSNormGated")(D, eps=3e-5),
        "mamba2": lambda: cls("mamba2", "MambaRMSNormGated")(D, eps=3e-5),
        "zamba2": lambda: cls("zamba2", "Zamba2RMSNormGated")(D, group_size=8, eps=3e-5),
        "falcon_h1-gate-norm": lambda: cls("falcon_h1", "FalconH1RMSNormGated")(
            D, eps=3e-5, n_groups=4, norm_before_gate=False),
        "falcon_h1-norm-gate": lambda: cls("falcon_h1", "FalconH1RMSNormGated")(
            D, eps=3e-5, n_groups=4, norm_before_gate=True),
    }
    # Error allowed relative to the largest expected value, in units of each result's dtype.
    # Up to three roundings to x's dtype lie between input and output ("hf"), and the
    # interpreter converts fp32 to bf16 by truncation (DESIGN.md), a full ulp each: 4 ulps.
    # fp32: the kernels reduce in another order and dweight sums over rows: a few tens of ulps.
    ulps = {torch.float32: 32, torch.bfloat16: 4, torch.float16: 4}
    # x, gate and weight dtypes; the last is what the Mamba2-style mixers of a bf16 model pass.
    cases = [(torch.float32,) * 3, (torch.bfloat16,) * 3, (torch.float16,) * 3,
             (torch.float32, torch.bfloat16, torch.bfloat16)]
    for name, build in sources.items():
        for x_dtype, gate_dtype, weight_dtype in cases:
            torch.manual_seed(0)
            src = build().to(weight_dtype)
            with torch.no_grad():
                src.weight.normal_(1.0, 0.5)
            new = TransformersRMSNormGated.from_module(src)
            x0 = (torch.randn(2, 3, D) * 2).to(x_dtype)
            p0 = (torch.randn(2, 3, D + 48) * 2).to(gate_dtype)
            dy = torch.randn(2, 3, D)
            results = []
            for module in (src, new):
                x, p = x0.clone().requires_grad_(), p0.clone().requires_grad_()
                y = module(x, p[..., 16:16 + D])
                y.backward(dy.to(y.dtype))
                results.append((y, x.grad, p.grad, module.weight.grad))
            for what, e, a in zip(("y", "dx", "dgate", "dweight"), *results):
                error = (a.double() - e.double()).abs().max().item()
                bound = ulps[e.dtype] * torch.finfo(e.dtype).eps * e.double().abs().max().item()
                case = (name, x_dtype, gate_dtype, weight_dtype, what)
                assert a.dtype == e.dtype and a.shape == e.shape, case
                assert error <= bound, (*case, error, bound)
    print("interpreted kernels match", len(sources), "sources")
""")


def test_kernels_match_sources_interpreted():
    assert "interpreted kernels match" in run_interpreted(INTERPRETED_CHECK)
