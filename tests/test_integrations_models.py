"""transformers integration on whole tiny models: patch / unpatch, bit for bit on the reference
path, through the interpreted kernels, and the mechanics of patching (parameters, state_dict,
shared modules, what is left alone and why).

Tiny models (hidden 64, 2 layers, vocab 128) are built from a config with random weights: no
download. Module-level checks and the source stand-ins are in test_integrations_transformers.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from gatednorm import ops  # noqa: E402
from gatednorm.integrations import transformers as gn_transformers  # noqa: E402
from gatednorm.integrations.transformers import TransformersRMSNormGated  # noqa: E402
from test_integrations_transformers import (  # noqa: E402
    HIDDEN,
    SOURCES,
    FusedRMSNormGated,
    _source_module,
    assert_bitwise,
    bit_exact,
)


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


# Multi-head latent attention with linear-attention layers (Kimi Linear, BailingHybrid).
MLA_HYBRID = dict(
    intermediate_size=128, moe_intermediate_size=32, num_attention_heads=4, num_key_value_heads=4,
    kv_lora_rank=16, qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=8, linear_head_dim=16,
    linear_num_heads=4, pad_token_id=0, layer_types=["linear_attention", "full_attention"])


def _kimi_linear():
    return "KimiLinearForCausalLM", dict(
        MLA_HYBRID, num_local_experts=4, num_experts_per_tok=2, bos_token_id=1, eos_token_id=2)


def _mamba_hybrid(model_name, **options):
    # Bamba and GraniteMoeHybrid: grouped gate-first norms from transformers 5.23.
    return model_name, dict(intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                            mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2,
                            mamba_d_state=16, mamba_chunk_size=8, **options)


def _linear_attention_moe(model_name, config_class="", **options):
    # Qwen3.5-MoE, LaraMini and Qwen4-Exp share Qwen3-Next's gated-delta-net layout.
    return model_name, dict(
        config_class=config_class, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=4, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        num_experts=4, num_experts_per_tok=2, **options)


def _olmo_hybrid():
    return "OlmoHybridForCausalLM", dict(
        intermediate_size=128, num_attention_heads=4, num_key_value_heads=4, pad_token_id=0,
        layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2,
        linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=32)


def _bailing_hybrid():
    return "BailingHybridForCausalLM", dict(
        MLA_HYBRID, num_expert_group=1, topk_group=1, num_experts_per_token=2, num_experts=4,
        head_dim=16, layer_group_size=2, mlp_layer_types=["dense", "sparse"],
        num_nextn_predict_layers=0, expert_swiglu_limit_list=[0, 0],
        share_expert_swiglu_limit_list=[0, 0])


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
# Families of transformers 5.23+ (skipped where the installed release lacks them). Glm5Next has
# no tiny CPU model (its indexed attention needs a kernel): its norm is checked module by module.
NEWER_FAMILIES = {
    "bamba": lambda: _mamba_hybrid("BambaForCausalLM", attn_layer_indices=[1]),
    "granitemoehybrid": lambda: _mamba_hybrid(
        "GraniteMoeHybridForCausalLM", num_local_experts=4, num_experts_per_tok=2,
        shared_intermediate_size=32, layer_types=["mamba", "attention"]),
    "qwen3_5_moe": lambda: _linear_attention_moe(
        "Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig",
        layer_types=["linear_attention", "full_attention"]),
    "lara_mini": lambda: _linear_attention_moe(
        "LaraMiniForCausalLM", layer_types=["linear_attention", "full_attention"]),
    "qwen4_exp": lambda: _linear_attention_moe(
        "Qwen4ExpForCausalLM", "Qwen4ExpTextConfig", pad_token_id=0,
        layer_types=["linear_attention", "indexed_attention"], hc_lowrank=8, ple_embed_dim=64,
        ngram_vocab_size_base=256, heads_per_ngram=2, indexer_n_heads=2, indexer_kv_heads=1,
        indexer_head_dim=16, indexer_budget=4, indexer_compress_ratio=2),
    "olmo_hybrid": _olmo_hybrid,
    "bailing_hybrid": _bailing_hybrid,
}
ALL_FAMILIES = {**FAMILIES, **NEWER_FAMILIES}
# The default run takes every family through forward and backward; generation and the
# interpreted kernels on the newer families are the slow step's.
SLOW_NEWER = [pytest.param(f, marks=pytest.mark.slow) for f in NEWER_FAMILIES]


def _tiny_model(family: str, dtype: torch.dtype) -> nn.Module:
    model_name, options = ALL_FAMILIES[family]()
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
    names = gn_transformers.patch(patched).replaced
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
@pytest.mark.parametrize("family", list(ALL_FAMILIES))
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
@pytest.mark.parametrize("family", [*FAMILIES, *SLOW_NEWER])
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
@pytest.mark.parametrize("family", [*FAMILIES, *SLOW_NEWER])
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
    names = gn_transformers.patch(model).replaced
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
    assert gn_transformers.patch(model).replaced == []  # idempotent


@bit_exact
def test_unpatch_restores_originals_with_trained_weights():
    model = _tiny_model("mamba2", torch.float32)
    originals = {name: m for name, m in model.named_modules()
                 if type(m).__name__ in ("MambaRMSNormGated", "Mamba2RMSNormGated")}
    names = gn_transformers.patch(model).replaced
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
    names = gn_transformers.patch(model).replaced
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
    assert gn_transformers.patch(patched).replaced
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(7))
    assert_bitwise(patched(ids, use_cache=False).logits, loaded(ids, use_cache=False).logits)


def test_shared_module_gets_one_replacement():
    source = _source_module(SOURCES[0])
    holder = nn.Module()
    holder.a = source
    holder.b = nn.Sequential(source)
    names = gn_transformers.patch(holder).replaced
    assert names == ["a", "b.0"]
    assert holder.a is holder.b[0] and isinstance(holder.a, TransformersRMSNormGated)
    assert gn_transformers.unpatch(holder) == ["a", "b.0"]
    assert holder.a is source and holder.b[0] is source


def test_patch_reports_and_warns_about_what_it_leaves_or_drops():
    class ToyRMSNormGated(nn.Module):
        pass

    holder = nn.Module()
    holder.toy = ToyRMSNormGated()
    holder.fla = FusedRMSNormGated(HIDDEN)
    holder.hooked = _source_module(SOURCES[0])
    holder.hooked.register_forward_hook(lambda *_: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = gn_transformers.patch(holder)
    assert report.replaced == ["hooked"]
    assert set(report.skipped) == {"toy", "fla"}
    assert "ToyRMSNormGated" in report.skipped["toy"] and "matches no known shape" in \
        report.skipped["toy"]
    assert "flash-linear-attention" in report.skipped["fla"]
    messages = " ".join(str(w.message) for w in caught)
    assert "toy: " in messages and "fla: " in messages
    assert "hooks" in messages and "hooked" in messages
