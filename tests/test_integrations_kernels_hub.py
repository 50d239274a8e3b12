"""gatednorm as the kernels hub's ``RMSNormGated`` layer: ``kernelize`` with gatednorm's mapping
on tiny models of every family whose gated norm transformers decorates, against the eager model.

CPU tensors (``device="cpu"``) run gatednorm's eager reference, bit for bit against the eager
model, or the Triton kernels through the interpreter; with CUDA the same tests run on the GPU
kernels too, within tolerance. Needs the ``kernels`` package at a version the installed
transformers accepts (transformers' decorator is a no-op otherwise): the pinned test set
(kernels 0.17.2 with transformers 5.18) and the newest-release run (.ci/latest.sh) run them.
"""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")
kernels = pytest.importorskip("kernels")

from gatednorm import ops  # noqa: E402
from gatednorm.integrations import kernels_hub  # noqa: E402
from gatednorm.integrations.probe import ConversionCheckError  # noqa: E402
from test_integrations_models import VOCAB, _forward_backward, _tiny_model  # noqa: E402
from test_integrations_transformers import (  # noqa: E402
    assert_bitwise,
    bit_exact,
)

_qwen3_next = transformers.models.qwen3_next.modeling_qwen3_next.Qwen3NextRMSNormGated
if getattr(_qwen3_next, "kernel_layer_name", None) != "RMSNormGated":
    pytest.skip(f"transformers {transformers.__version__} does not mark its gated norms for "
                f"kernels {kernels.__version__} (outside the versions it accepts)",
                allow_module_level=True)

# The families whose gated norm transformers decorates (Glm5Next's too; it has no tiny CPU
# model).
DECORATED = ["qwen3_next", "qwen3_5", "kimi_linear", "qwen3_5_moe", "lara_mini", "qwen4_exp",
             "olmo_hybrid", "bailing_hybrid"]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _decorated_norms(model):
    return [name for name, module in model.named_modules()
            if getattr(type(module), "kernel_layer_name", None) == kernels_hub.LAYER_NAME]


def _kernelized(model, mode, device):
    kernelized = copy.deepcopy(model)
    with kernels.use_kernel_mapping(kernels_hub.mapping()):
        kernels.kernelize(kernelized, mode=mode, device=device)
    return kernelized


def _family_model(family, dtype, device="cpu"):
    model = _tiny_model(family, dtype).to(device)
    assert _decorated_norms(model), f"{family} has no RMSNormGated-decorated norm"
    return model


@bit_exact
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", DECORATED)
def test_kernelized_model_trains_bit_identically(family, dtype):
    model = _family_model(family, dtype)
    kernelized = _kernelized(model, kernels.Mode.TRAINING, "cpu")
    names = kernels_hub.check(kernelized)
    assert names == _decorated_norms(model)
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))
    logits, grads = _forward_backward(model, ids)
    kernelized_logits, kernelized_grads = _forward_backward(kernelized, ids)
    assert_bitwise(kernelized_logits, logits)
    for name, grad in grads.items():
        if grad is not None:
            assert_bitwise(kernelized_grads[name], grad)


@bit_exact
@pytest.mark.parametrize("family", ["qwen3_next", "kimi_linear"])
def test_kernelized_model_generates_identically(family):
    model = _family_model(family, torch.bfloat16).eval()
    kernelized = _kernelized(model, kernels.Mode.INFERENCE, "cpu")
    ids = torch.randint(3, VOCAB, (2, 5), generator=torch.Generator().manual_seed(4))
    kwargs = dict(max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert torch.equal(kernelized.generate(ids, **kwargs), model.generate(ids, **kwargs))
    assert kernels_hub.check(kernelized)


def test_layer_is_bound_in_every_mode_and_keeps_the_weights():
    model = _family_model("qwen3_next", torch.float32)
    for mode in (kernels.Mode.INFERENCE, kernels.Mode.TRAINING,
                 kernels.Mode.TRAINING | kernels.Mode.TORCH_COMPILE):
        kernelized = _kernelized(model, mode, "cpu")
        norm = kernelized.get_submodule(_decorated_norms(model)[0])
        assert kernels_hub.is_kernelized(norm), mode
        assert list(kernelized.state_dict()) == list(model.state_dict())


def _two_group_forward(self, hidden_states, gate):
    """Qwen3-Next's forward normalizing two halves apart, as a release might change it."""
    input_dtype = hidden_states.dtype
    h = hidden_states.to(torch.float32).unflatten(-1, (2, -1))
    h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)).flatten(-2)
    h = self.weight * h.to(input_dtype)
    return (h * torch.nn.functional.silu(gate.to(torch.float32))).to(input_dtype)


def test_a_forward_the_conversion_misreads_is_an_error(monkeypatch):
    model = _family_model("qwen3_next", torch.float32)
    kernelized = _kernelized(model, kernels.Mode.TRAINING, "cpu")
    name = _decorated_norms(model)[0]
    monkeypatch.setattr(_qwen3_next, "forward", _two_group_forward)
    with pytest.raises(ConversionCheckError, match=name + r" \(.*Qwen3NextRMSNormGated\)"):
        kernels_hub.check(kernelized)
    ids = torch.randint(0, VOCAB, (1, 4))
    with pytest.raises(ConversionCheckError, match="differs by"):
        kernelized(ids)


@pytest.mark.skipif(not ops.INTERPRET and not torch.cuda.is_available(),
                    reason="needs the Triton kernels: TRITON_INTERPRET=1 on CPU, or CUDA")
@pytest.mark.parametrize("device", DEVICES)
def test_kernelized_model_on_the_kernels(device):
    # fp32 through two layers: the kernels reorder the reduction (about 1e-7 relative).
    model = _family_model("qwen3_next", torch.float32, device)
    kernelized = _kernelized(model, kernels.Mode.TRAINING, device)
    assert kernels_hub.check(kernelized)
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))
    ids = ids.to(device)
    logits, grads = _forward_backward(model, ids)
    kernelized_logits, kernelized_grads = _forward_backward(kernelized, ids)
    torch.testing.assert_close(kernelized_logits, logits, rtol=0,
                               atol=1e-5 * logits.abs().max().item())
    for name, grad in grads.items():
        if grad is not None:
            torch.testing.assert_close(kernelized_grads[name], grad, rtol=0,
                                       atol=1e-4 * grad.abs().max().item() + 1e-8)
