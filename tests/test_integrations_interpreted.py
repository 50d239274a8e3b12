"""The Triton kernels, run by the interpreter in a fresh process, behind TransformersRMSNormGated
against each transformers source module: forward and backward, every dtype mix the models pass,
conversion checks included (run on the kernels too)."""

from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("transformers")

from conftest import run_interpreted  # noqa: E402


INTERPRETED_CHECK = textwrap.dedent("""
    import importlib, importlib.util, inspect, torch
    import gatednorm
    from gatednorm import ops, reference
    from gatednorm.integrations.transformers import TransformersRMSNormGated
    assert ops.INTERPRET

    def forbidden(*args, **kwargs):
        raise AssertionError("the reference composite ran instead of the kernels")
    composite = reference.rms_norm_gated
    reference.rms_norm_gated = forbidden

    def cls(model_dir, name):
        module = importlib.import_module(f"transformers.models.{model_dir}.modeling_{model_dir}")
        return getattr(module, name)

    def mamba2():
        # Mamba2RMSNormGated (grouped) from transformers 5.23, MambaRMSNormGated before.
        module = importlib.import_module("transformers.models.mamba2.modeling_mamba2")
        klass = getattr(module, "Mamba2RMSNormGated", None) or module.MambaRMSNormGated
        if "group_size" in inspect.signature(klass.__init__).parameters:
            return klass(D, group_size=8, eps=3e-5)
        return klass(D, eps=3e-5)

    D = 32
    all_sources = {
        "qwen3_next": lambda: cls("qwen3_next", "Qwen3NextRMSNormGated")(D, eps=3e-5),
        "kimi_linear": lambda: cls("kimi_linear", "KimiLinearRMSNormGated")(D, eps=3e-5),
        "mamba2": mamba2,
        "zamba2": lambda: cls("zamba2", "Zamba2RMSNormGated")(D, group_size=8, eps=3e-5),
        "falcon_h1-gate-norm": lambda: cls("falcon_h1", "FalconH1RMSNormGated")(
            D, eps=3e-5, n_groups=4, norm_before_gate=False),
        "falcon_h1-norm-gate": lambda: cls("falcon_h1", "FalconH1RMSNormGated")(
            D, eps=3e-5, n_groups=4, norm_before_gate=True),
    }
    # Models the installed transformers does not have (4.57 has no Kimi Linear) are left out.
    sources = {name: build for name, build in all_sources.items()
               if importlib.util.find_spec("transformers.models." + name.split("-")[0])}
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
            reference.rms_norm_gated = composite  # the conversion check's fp64 truth
            new = TransformersRMSNormGated.from_module(src)
            reference.rms_norm_gated = forbidden
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
    print("interpreted kernels match", len(sources), "of", len(all_sources), "sources")
""")


def test_kernels_match_sources_interpreted():
    import transformers

    output = run_interpreted(INTERPRETED_CHECK)
    assert "interpreted kernels match" in output
    # Every source model of transformers 5.x; 4.57 has no Kimi Linear.
    expected = 5 if transformers.__version__.startswith("4.") else 6
    assert f"match {expected} of 6 sources" in output, output
