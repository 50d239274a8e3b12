"""The conversion check: what it catches, what strict=False does, what it costs, and classes
recognized by their forward rather than their name.

The regression it guards against: transformers 5.23 made MambaRMSNormGated normalize per group
of ``group_size``; a converter that trusted the class name converted it ungrouped, and a tiny
Mamba2 model's logits moved by 30 % without an error. Here a class with that layout hides its
group size under an attribute the reader does not know, so that only the check can catch it.
"""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from gatednorm import integrations, ops  # noqa: E402
from gatednorm.integrations import convert  # noqa: E402
from gatednorm.integrations import transformers as gn_transformers  # noqa: E402
from gatednorm.integrations.transformers import TransformersRMSNormGated  # noqa: E402
from test_integrations_models import _tiny_model  # noqa: E402
from test_integrations_transformers import (  # noqa: E402
    HIDDEN,
    assert_bitwise,
    bit_exact,
)

PATH = "transformers.models.mamba2.modeling_mamba2"


def _grouped_forward(module, hidden_states, gate=None):
    """transformers 5.23's grouped gate-first forward, written out (the group count read from
    ``module.groups``)."""
    input_dtype = hidden_states.dtype
    h = hidden_states.to(torch.float32)
    if gate is not None:
        h = h * nn.functional.silu(gate.to(torch.float32))
    grouped = h.unflatten(-1, (module.groups, -1))
    grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True)
                                    + module.variance_epsilon)
    return module.weight * grouped.flatten(-2).to(input_dtype)


class MambaRMSNormGated(nn.Module):
    """A MambaRMSNormGated (name and package of transformers' class) whose forward groups by an
    attribute the converter does not read: converted by its class, it would be wrong."""

    def __init__(self, hidden_size=HIDDEN, groups=4, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps
        self.groups = groups

    forward = _grouped_forward


MambaRMSNormGated.__module__ = PATH


class Holder(nn.Module):
    def __init__(self, norm: nn.Module):
        super().__init__()
        self.mixer = nn.Module()
        self.mixer.norm = norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_check_catches_a_forward_the_class_table_misreads(dtype):
    model = Holder(MambaRMSNormGated().to(dtype))
    with pytest.raises(integrations.ConversionCheckError) as error:
        gn_transformers.patch(model)
    message = str(error.value)
    assert "mixer.norm" in message and f"{PATH}.MambaRMSNormGated" in message
    assert "differs by" in message and "relative L2" in message
    assert type(model.mixer.norm) is MambaRMSNormGated  # nothing replaced
    with pytest.raises(integrations.ConversionCheckError, match="MambaRMSNormGated"):
        integrations.from_module(model.mixer.norm)


def test_non_strict_patch_leaves_the_module_and_reports_it():
    source = MambaRMSNormGated()
    model = Holder(source)
    model.other = Holder(_grouped_zamba2())
    with pytest.warns(UserWarning, match="mixer.norm"):
        report = gn_transformers.patch(model, strict=False)
    assert model.mixer.norm is source
    assert report.replaced == ["other.mixer.norm"]
    assert list(report.skipped) == ["mixer.norm"] and "differs by" in report.skipped["mixer.norm"]
    assert report.probes == 2


def _grouped_zamba2():
    cls = transformers.models.zamba2.modeling_zamba2.Zamba2RMSNormGated
    return cls(HIDDEN, group_size=HIDDEN // 4)


def test_bad_attributes_are_errors_naming_path_and_class():
    norm = _grouped_zamba2()
    norm.group_size = 5
    with pytest.raises(integrations.UnsupportedModuleError) as error:
        gn_transformers.patch(Holder(norm))
    assert "mixer.norm" in str(error.value) and "Zamba2RMSNormGated" in str(error.value)
    assert "does not divide" in str(error.value)
    del norm.weight
    with pytest.raises(integrations.UnsupportedModuleError, match="1-D weight"):
        integrations.from_module(norm)
    report = gn_transformers.patch(Holder(norm), strict=False)
    assert report.replaced == [] and "1-D weight" in report.skipped["mixer.norm"]


QWEN3_NEXT_PATH = "transformers.models.qwen3_next.modeling_qwen3_next"


class Qwen3NextRMSNormGated(nn.Module):
    """transformers 4.57's Qwen3NextRMSNormGated, written out: no ``activation`` attribute, its
    forward calls SiLU (or ``gate_function``, to stand for a class that calls another)."""

    gate_function = staticmethod(nn.functional.silu)

    def __init__(self, hidden_size=HIDDEN, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states, gate=None):
        input_dtype = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        h = self.weight * h.to(input_dtype)
        return (h * self.gate_function(gate.to(torch.float32))).to(input_dtype)


Qwen3NextRMSNormGated.__module__ = QWEN3_NEXT_PATH


@bit_exact
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_norm_gate_class_without_activation_attribute_converts_as_silu(dtype):
    torch.manual_seed(0)
    source = Qwen3NextRMSNormGated(eps=3e-5).to(dtype)
    with torch.no_grad():
        source.weight.normal_(1.0, 0.5)
    assert not hasattr(source, "activation")
    replacement = integrations.from_module(source)
    assert replacement.activation == "silu" and replacement.rounding == "hf"
    x, gate = torch.randn(3, 5, HIDDEN).to(dtype), (2 * torch.randn(3, 5, HIDDEN)).to(dtype)
    with torch.no_grad():
        assert_bitwise(replacement(x, gate), source(x, gate))


def test_norm_gate_class_without_activation_attribute_calling_sigmoid_fails_the_check():
    source = type("Qwen3NextRMSNormGated", (Qwen3NextRMSNormGated,),
                  {"__module__": QWEN3_NEXT_PATH,
                   "gate_function": staticmethod(torch.sigmoid)})()
    with pytest.raises(integrations.ConversionCheckError, match="Qwen3NextRMSNormGated"):
        integrations.from_module(source)


def test_another_op_is_never_converted():
    axk2 = getattr(transformers.models, "axk2", None)
    if axk2 is None:
        pytest.skip(f"transformers {transformers.__version__} has no AXK2")
    config = transformers.AXK2Config(hidden_size=HIDDEN)
    norm = axk2.modeling_axk2.AXK2GatedRMSNorm(config)
    with pytest.raises(integrations.UnsupportedModuleError, match="another op"):
        integrations.from_module(norm)
    with pytest.warns(UserWarning, match="another op"):
        report = gn_transformers.patch(Holder(norm))
    assert report.replaced == [] and "gated by an MLP" in report.skipped["mixer.norm"]


class MyModelGatedRMSNorm(nn.Module):
    """A remote-code gated norm gatednorm has not seen: Qwen3-Next's forward under another name."""

    def __init__(self, hidden_size=HIDDEN):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(hidden_size) * 0.5 + 1)
        self.variance_epsilon = 1e-6
        self.activation = "silu"

    def forward(self, hidden_states, gate):
        input_dtype = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        h = self.weight * h.to(input_dtype)
        return (h * nn.functional.silu(gate.to(torch.float32))).to(input_dtype)


class TanhGatedRMSNorm(MyModelGatedRMSNorm):
    """A gated norm whose gate is tanh: no known shape."""

    def forward(self, hidden_states, gate):
        normed = super().forward(hidden_states, torch.zeros_like(gate))
        return normed * 2 * torch.tanh(gate)


MyModelGatedRMSNorm.__module__ = TanhGatedRMSNorm.__module__ = "transformers_modules.me.model"


@bit_exact
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_unknown_class_with_a_known_forward_is_recognized_and_checked(dtype):
    source = MyModelGatedRMSNorm().to(dtype)
    spec = convert.describe(source)
    assert (spec.shape, spec.rounding, spec.activation) == ("norm-gate-hf", "hf", "silu")
    model = Holder(source)
    assert gn_transformers.patch(model).replaced == ["mixer.norm"]
    x, gate = torch.randn(3, HIDDEN).to(dtype), torch.randn(3, HIDDEN).to(dtype)
    assert_bitwise(model.mixer.norm(x, gate), source(x, gate))


def test_unknown_class_with_an_unknown_forward_is_reported():
    with pytest.warns(UserWarning, match="matches no known shape"):
        report = gn_transformers.patch(Holder(TanhGatedRMSNorm()))
    assert report.replaced == [] and "TanhGatedRMSNorm" in report.skipped["mixer.norm"]
    with pytest.raises(integrations.UnsupportedModuleError, match="matches no known shape"):
        integrations.from_module(TanhGatedRMSNorm())


def test_patch_leaves_the_random_stream_alone():
    model = Holder(_grouped_zamba2())
    state = torch.random.get_rng_state()
    gn_transformers.patch(model)
    assert torch.equal(torch.random.get_rng_state(), state)


def _convert_each_dtype():
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        TransformersRMSNormGated.from_module(_grouped_zamba2().to(dtype))


@bit_exact
def test_check_on_the_reference_path():
    # Same bits required, with and without a gate, for a grouped gate-first norm.
    _convert_each_dtype()


@pytest.mark.skipif(not ops.INTERPRET, reason="needs TRITON_INTERPRET=1 before import")
def test_check_on_the_interpreted_kernels():
    # The tolerance rule: error against fp64 at most twice the module's own, plus one unit.
    _convert_each_dtype()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_check_on_cuda():
    # The GPU kernels: good conversions pass in every dtype, the misread class still fails.
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        TransformersRMSNormGated.from_module(_grouped_zamba2().to("cuda", dtype))
        with pytest.raises(integrations.ConversionCheckError, match="differs by"):
            gn_transformers.patch(Holder(MambaRMSNormGated().to("cuda", dtype)))


def test_one_probe_per_configuration_on_a_48_layer_model():
    # Qwen3-Next's real layout: 48 layers, three linear-attention layers in four, each with a
    # gated norm of the same configuration (tiny widths here: the count is what matters).
    from test_integrations_models import FAMILIES

    _, options = FAMILIES["qwen3_next"]()
    options = dict(options, layer_types=["linear_attention"] * 3 + ["full_attention"])
    options["layer_types"] = options["layer_types"] * 12
    config = transformers.Qwen3NextConfig(vocab_size=128, hidden_size=64, num_hidden_layers=48,
                                          **options)
    model = transformers.Qwen3NextForCausalLM(config)
    start = time.perf_counter()
    report = gn_transformers.patch(model)
    seconds = time.perf_counter() - start
    assert len(report.replaced) == 36 and report.probes == 1
    assert seconds < 5, seconds  # about 20 ms on a shared 2-core CPU


def test_tiny_mamba2_logits_match_after_patch():
    # The report, on the installed release: n_groups = 2 (grouped norms from 5.23).
    model = _tiny_model("mamba2", torch.float32)
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(0))
    expected = model(ids, use_cache=False).logits
    gn_transformers.patch(model)
    actual = model(ids, use_cache=False).logits
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
