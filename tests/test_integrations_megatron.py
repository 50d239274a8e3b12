"""Megatron integration: gdn_gated_norm / MegatronGatedRMSNorm against GDN's unfused formula.

The unfused formula is written here as Megatron-Core's GatedDeltaNet._apply_gated_norm runs it,
with TransformerEngine's RMSNorm (fp32 math, output in x's dtype, ``1 + weight`` when
zero-centered) in eager PyTorch: TE itself is not installed on CPU. On the CPU reference path
(forced by the reference_path fixture) the fused op must give the same bits forward and
backward; the Triton kernels are checked through the interpreter in a subprocess.
"""

from __future__ import annotations

import textwrap
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import run_interpreted
from gatednorm import functional, ops
from gatednorm.kernels import launch
from gatednorm.integrations.megatron import MegatronGatedRMSNorm, gdn_gated_norm


bit_exact = pytest.mark.usefixtures("reference_path")


def te_rms_norm(x, weight, eps, zero_centered_gamma):
    """TransformerEngine's RMSNorm forward: fp32 compute, one rounding to x's dtype."""
    xf = x.float()
    gamma = weight.float() + 1 if zero_centered_gamma else weight.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * gamma).to(x.dtype)


def megatron_unfused(x, gate, weight, eps, zero_centered_gamma, act_fn=F.silu):
    """GatedDeltaNet._apply_gated_norm with out_norm = TE RMSNorm (returns [B*S*H, D])."""
    x_dtype = x.dtype
    x = x.reshape(-1, x.shape[-1])
    y = te_rms_norm(x, weight, eps, zero_centered_gamma)
    gate = gate.reshape(-1, gate.shape[-1])
    y = y * act_fn(gate.float())
    return y.to(x_dtype)


def _gdn_inputs(dtype, b=2, s=5, h=3, d=16, weight_dtype=None, zero_centered_gamma=False):
    """x [B, S, H, D]; the gate a strided [B, S, H, D] view of the in_proj output, as GDN
    splits it (qkv | gate | beta | alpha along the last dim)."""
    torch.manual_seed(0)
    x = (torch.randn(b, s, h, d) * 2).to(dtype)
    qkvzba = (torch.randn(b, s, 3 * h * d + h * d + 2 * h) * 2).to(dtype)
    centre = 0.0 if zero_centered_gamma else 1.0
    weight = (centre + 0.3 * torch.randn(d)).to(weight_dtype or dtype)
    dy = torch.randn(b, s, h, d).to(dtype)
    return x, qkvzba, weight, dy


def _gate_of(qkvzba, h, d):
    b, s, _ = qkvzba.shape
    return qkvzba[..., 3 * h * d: 4 * h * d].reshape(b, s, h, d)


def _fwd_bwd(fn, x, qkvzba, weight, dy, h, d, contiguous_gate=False):
    x = x.detach().clone().requires_grad_()
    qkvzba = qkvzba.detach().clone().requires_grad_()
    weight = weight.detach().clone().requires_grad_()
    gate = _gate_of(qkvzba, h, d)
    assert not gate.is_contiguous()
    if contiguous_gate:
        gate = gate.contiguous()
    y = fn(x, gate, weight).reshape(dy.shape)
    y.backward(dy)
    return y, x.grad, qkvzba.grad, weight.grad


def assert_bitwise(actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert torch.equal(actual, expected), (actual.float() - expected.float()).abs().max().item()


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@bit_exact
@pytest.mark.parametrize("gate_layout", ["strided", "contiguous"])
@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
@pytest.mark.parametrize("zero_centered_gamma", [False, True], ids=["gamma", "zero-centered"])
@pytest.mark.parametrize("weight_dtype", [None, torch.float32],
                         ids=["weight-in-x-dtype", "fp32-weight"])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_gdn_gated_norm_matches_unfused(dtype, weight_dtype, zero_centered_gamma, activation,
                                        gate_layout):
    h, d, eps = 3, 16, 1e-5
    x, qkvzba, weight, dy = _gdn_inputs(dtype, h=h, d=d, weight_dtype=weight_dtype,
                                        zero_centered_gamma=zero_centered_gamma)
    act_fn = F.silu if activation == "silu" else torch.sigmoid
    contiguous = gate_layout == "contiguous"
    fused = _fwd_bwd(lambda x, g, w: gdn_gated_norm(x, g, w, eps, zero_centered_gamma,
                                                    gate_activation=activation),
                     x, qkvzba, weight, dy, h, d, contiguous)
    unfused = _fwd_bwd(lambda x, g, w: megatron_unfused(x, g, w, eps, zero_centered_gamma, act_fn),
                       x, qkvzba, weight, dy, h, d, contiguous)
    for a, e in zip(fused, unfused):
        if dtype == torch.float32 and not contiguous:
            # The unfused formula's gate.reshape(-1, D) copies the view; PyTorch's CPU silu and
            # sigmoid vectorize a long contiguous run and fall back to a scalar loop on short
            # rows, and the two differ in the last bit. A 16-bit gate is upcast (copied) before
            # the activation on both sides, and CUDA's elementwise math ignores the layout.
            torch.testing.assert_close(a, e, rtol=0, atol=4 * 2 ** -23 * e.abs().max().item())
        else:
            assert_bitwise(a, e)


@pytest.mark.parametrize("zero_centered_gamma", [False, True])
def test_module_initial_weight_and_state_dict(zero_centered_gamma):
    norm = MegatronGatedRMSNorm(16, 1e-5, zero_centered_gamma=zero_centered_gamma,
                                dtype=torch.bfloat16)
    expected = torch.zeros(16) if zero_centered_gamma else torch.ones(16)
    assert torch.equal(norm.weight.float(), expected) and norm.weight.dtype == torch.bfloat16
    assert list(norm.state_dict()) == ["weight"]  # as TE's RMSNorm: out_norm.weight loads as is
    assert (norm.rounding, norm.norm_before_gate, norm.group_size) == ("te", True, None)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_weight_carries_sequence_parallel(sequence_parallel):
    norm = MegatronGatedRMSNorm(16, sequence_parallel=sequence_parallel)
    assert norm.weight.sequence_parallel is sequence_parallel
    # Megatron reads the attribute from the Parameter when it all-reduces layernorm grads; it
    # must survive dtype moves and checkpoint loads, which keep the Parameter object.
    norm.to(torch.bfloat16)
    norm.load_state_dict({"weight": torch.full((16,), 0.5)})
    assert norm.weight.sequence_parallel is sequence_parallel
    grads_to_allreduce = [p for p in norm.parameters() if getattr(p, "sequence_parallel", False)]
    assert len(grads_to_allreduce) == int(sequence_parallel)


def test_from_config_reads_a_transformer_config():
    config = types.SimpleNamespace(layernorm_epsilon=3e-6, layernorm_zero_centered_gamma=True,
                                   sequence_parallel=True, params_dtype=torch.bfloat16,
                                   activation_func=F.silu)
    norm = MegatronGatedRMSNorm.from_config(config, hidden_size=32, device="cpu")
    assert (norm.hidden_size, norm.eps, norm.zero_centered_gamma, norm.activation) == \
        (32, 3e-6, True, "silu")
    assert norm.weight.dtype == torch.bfloat16 and norm.weight.sequence_parallel is True
    assert MegatronGatedRMSNorm.from_config(config, 32, eps=1e-5, device="cpu").eps == 1e-5
    config.activation_func = F.gelu
    with pytest.raises(ValueError, match="silu or sigmoid"):
        MegatronGatedRMSNorm.from_config(config, 32, device="cpu")


class _TENormStandIn(nn.Module):
    """TE RMSNorm as GDN builds its out_norm (forward only: the part GDN calls)."""

    def __init__(self, hidden_size, eps, zero_centered_gamma, dtype):
        super().__init__()
        init = torch.zeros if zero_centered_gamma else torch.ones
        self.weight = nn.Parameter(init(hidden_size, dtype=dtype))
        self.eps, self.zero_centered_gamma = eps, zero_centered_gamma

    def forward(self, x):
        return te_rms_norm(x, self.weight, self.eps, self.zero_centered_gamma)


class _GDNStandIn(nn.Module):
    """The part of megatron.core.ssm.gated_delta_net.GatedDeltaNet around the output norm."""

    def __init__(self, config, value_head_dim):
        super().__init__()
        self.act_fn = config.activation_func
        self.out_norm = _TENormStandIn(value_head_dim, config.layernorm_epsilon,
                                       config.layernorm_zero_centered_gamma, config.params_dtype)

    def _apply_gated_norm(self, x, gate):
        return megatron_unfused(x, gate, self.out_norm.weight, self.out_norm.eps,
                                self.out_norm.zero_centered_gamma, self.act_fn)

    def output(self, core_attn_out, gate):
        batch, seq_len = core_attn_out.shape[:2]
        return self._apply_gated_norm(core_attn_out, gate).reshape(batch, seq_len, -1)


class _FusedGDNStandIn(_GDNStandIn):
    """The wiring docs/integrations.md shows: out_norm replaced, _apply_gated_norm overridden."""

    def __init__(self, config, value_head_dim):
        super().__init__(config, value_head_dim)
        self.out_norm = MegatronGatedRMSNorm.from_config(config, value_head_dim, device="cpu")

    def _apply_gated_norm(self, x, gate):
        return self.out_norm(x, gate)


@bit_exact
def test_documented_gdn_wiring_matches_and_loads_checkpoints():
    h, d = 3, 16
    config = types.SimpleNamespace(layernorm_epsilon=1e-6, layernorm_zero_centered_gamma=True,
                                   sequence_parallel=False, params_dtype=torch.bfloat16,
                                   activation_func=F.silu)
    unfused, fused = _GDNStandIn(config, d), _FusedGDNStandIn(config, d)
    with torch.no_grad():
        unfused.out_norm.weight.normal_(0.0, 0.3)
    fused.load_state_dict(unfused.state_dict(), strict=True)
    x, qkvzba, _, _ = _gdn_inputs(torch.bfloat16, h=h, d=d)
    results = []
    for layer in (unfused, fused):
        xl = x.clone().requires_grad_()
        proj = qkvzba.clone().requires_grad_()
        out = layer.output(xl, _gate_of(proj, h, d))
        torch.manual_seed(1)
        out.backward(torch.randn(out.shape).to(out.dtype))
        results.append((out, xl.grad, proj.grad, layer.out_norm.weight.grad))
    for a, e in zip(*results[::-1]):
        assert_bitwise(a, e)


@bit_exact
def test_module_compiles_fullgraph_forward_and_backward():
    norm = MegatronGatedRMSNorm(16, zero_centered_gamma=True)
    with torch.no_grad():
        norm.weight.normal_(0.0, 0.3)
    compiled = torch.compile(norm, fullgraph=True, backend="aot_eager")
    x, qkvzba, _, dy = _gdn_inputs(torch.float32)
    eager = _fwd_bwd(lambda x, g, w: norm(x, g), x, qkvzba, norm.weight, dy, 3, 16)
    norm.weight.grad = None
    traced = _fwd_bwd(lambda x, g, w: compiled(x, g), x, qkvzba, norm.weight, dy, 3, 16)
    for a, e in zip(traced[:3], eager[:3]):
        assert_bitwise(a, e)


INTERPRETED_CHECK = textwrap.dedent("""
    import torch
    import torch.nn.functional as F
    from gatednorm import ops, reference
    from gatednorm.integrations.megatron import gdn_gated_norm
    assert ops.INTERPRET

    def forbidden(*args, **kwargs):
        raise AssertionError("the reference composite ran instead of the kernels")
    reference.rms_norm_gated = forbidden

    def unfused(x, gate, weight, eps, zero_centered_gamma):
        xf = x.reshape(-1, x.shape[-1]).float()
        gamma = weight.float() + 1 if zero_centered_gamma else weight.float()
        y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * gamma).to(x.dtype)
        return (y * F.silu(gate.reshape(-1, gate.shape[-1]).float())).to(x.dtype)

    # Relative to the largest value, in units of each result's dtype: two roundings to x's
    # dtype, each a full ulp under the interpreter's bf16 truncation (DESIGN.md); fp32 differs
    # in reduction order only.
    ulps = {torch.float32: 32, torch.bfloat16: 4, torch.float16: 4}
    b, s, h, d = 2, 3, 2, 16
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for zero_centered_gamma in (False, True):
            torch.manual_seed(0)
            x0 = (torch.randn(b, s, h, d) * 2).to(dtype)
            p0 = (torch.randn(b, s, 5 * h * d) * 2).to(dtype)
            w0 = ((0.0 if zero_centered_gamma else 1.0) + 0.3 * torch.randn(d)).to(dtype)
            dy = torch.randn(b, s, h, d).to(dtype)
            results = []
            for fn in (unfused, gdn_gated_norm):
                x, p, w = (t.clone().requires_grad_() for t in (x0, p0, w0))
                gate = p[..., 3 * h * d: 4 * h * d].reshape(b, s, h, d)
                y = fn(x, gate, w, 1e-5, zero_centered_gamma).reshape(dy.shape)
                y.backward(dy)
                results.append((y, x.grad, p.grad, w.grad))
            for what, e, a in zip(("y", "dx", "dgate", "dweight"), *results):
                error = (a.double() - e.double()).abs().max().item()
                bound = ulps[e.dtype] * torch.finfo(e.dtype).eps * e.double().abs().max().item()
                assert a.dtype == e.dtype and a.shape == e.shape, (dtype, what)
                assert error <= bound, (dtype, zero_centered_gamma, what, error, bound)
    print("interpreted kernels match the unfused formula")
""")


def test_kernels_match_unfused_interpreted():
    assert "interpreted kernels match" in run_interpreted(INTERPRETED_CHECK)


# --- Megatron-Core's fused GDN output norm, written as its formula ------------------------------

def up(t):
    """fp32 working precision, or fp64 for fp64 inputs."""
    return t if t.dtype == torch.float64 else t.float()


class MegatronFusedFormula(torch.autograd.Function):
    """The formula of megatron/core/fusions/fused_gated_norm.py (gdn_gated_output_norm_fusion),
    in eager PyTorch: forward ``R(R(x * rstd * gamma) * act(g))``; backward with the gradient
    entering the norm rounded to x's dtype, ``dgate = dy * norm * act'(g)`` in fp32, and dgamma
    summed in fp32. R rounds to x's dtype; float64 inputs stay float64 (the exact formula)."""

    @staticmethod
    def forward(ctx, x, gate, weight, eps, zero_centered, gate_activation):
        xf, g = up(x), up(gate)
        gamma = up(weight) + 1 if zero_centered else up(weight)
        rstd = torch.rsqrt((xf * xf).sum(-1, keepdim=True) / x.shape[-1] + eps)
        norm = up((xf * rstd * gamma).to(x.dtype))
        act = torch.sigmoid(g) if gate_activation == "sigmoid" else g * torch.sigmoid(g)
        ctx.save_for_backward(x, gate, weight, rstd)
        ctx.options = zero_centered, gate_activation
        return (norm * act).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, gate, weight, rstd = ctx.saved_tensors
        zero_centered, gate_activation = ctx.options
        xf, g, grad = up(x), up(gate), up(dy)
        gamma = up(weight) + 1 if zero_centered else up(weight)
        xn = xf * rstd
        norm = up((xn * gamma).to(x.dtype))
        sig = torch.sigmoid(g)
        if gate_activation == "sigmoid":
            grad_norm = up((grad * sig).to(x.dtype))
            grad_gate = (grad * norm) * (sig * (1 - sig))
        else:
            grad_norm = up((grad * (g * sig)).to(x.dtype))
            grad_gate = (grad * norm) * (sig * (1 + g * (1 - sig)))
        weighted = grad_norm * gamma
        dot = (weighted * xn).sum(-1, keepdim=True) / x.shape[-1]
        dx = (weighted - xn * dot) * rstd
        dweight = (grad_norm * xn).reshape(-1, x.shape[-1]).sum(0)
        return (dx.to(x.dtype), grad_gate.to(gate.dtype), dweight.to(weight.dtype), None, None,
                None)


# Allowed difference, in units of each result's dtype at the top of its range: the two sides
# differ in the association of fp32 products and sums; a 16-bit result may flip one rounding
# (two under the interpreter's truncating bf16 conversion) and dweight sums over rows in fp32.
FORMULA_UNITS = {torch.float64: 2 ** 20, torch.float32: 64, torch.bfloat16: 4, torch.float16: 4}


@pytest.mark.parametrize("path", ["reference", "interpreter", "cuda"])
@pytest.mark.parametrize("gate_activation", ["silu", "sigmoid"])
@pytest.mark.parametrize("zero_centered", [False, True], ids=["gamma", "zero-centered"])
@pytest.mark.parametrize("dtype", [torch.float64, *DTYPES.values()],
                         ids=["fp64", *DTYPES])
def test_follows_megatron_fused_gated_norm(dtype, zero_centered, gate_activation, path,
                                           request):
    # Megatron's argument order and meaning (x, gate, weight, eps, zero_centered,
    # gate_activation), on GDN's [B, S, H, D] layout with the gate a strided projection slice.
    if path == "interpreter" and (not ops.INTERPRET or dtype == torch.float64):
        pytest.skip("the interpreter runs the kernels for 16/32-bit inputs under "
                    "TRITON_INTERPRET=1 (fp64 always takes the reference)")
    if path == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if path == "reference":
        request.getfixturevalue("reference_path")
    h, d, eps = 3, 24, 1e-5  # D = 24: Megatron's own kernel would refuse it (not a power of 2)
    inputs = _gdn_inputs(dtype, h=h, d=d, zero_centered_gamma=zero_centered)
    x, qkvzba, weight, dy = (t.to("cuda" if path == "cuda" else "cpu") for t in inputs)
    args = (eps, zero_centered, gate_activation)
    ours = _fwd_bwd(lambda x, g, w: gdn_gated_norm(x, g, w, *args), x, qkvzba, weight, dy, h, d)
    formula = _fwd_bwd(lambda x, g, w: MegatronFusedFormula.apply(x, g, w, *args),
                       x, qkvzba, weight, dy, h, d)
    for what, a, e in zip(("y", "dx", "dgate", "dweight"), ours, formula):
        assert a.dtype == e.dtype and a.shape == e.shape, what
        error = (a.double() - e.double()).abs().max().item()
        bound = FORMULA_UNITS[e.dtype] * torch.finfo(e.dtype).eps * e.double().abs().max().item()
        assert error <= bound, (what, error, bound)
