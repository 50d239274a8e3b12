"""Each reference composite equals, bit for bit, the framework code it claims to reproduce.

The framework formulas below are written from each framework's own description (Megatron and
flash-linear-attention are not dependencies); the transformers modules are the real classes of
the installed transformers. All run eagerly on CPU in bf16 and fp16: no Triton here.
"""

import importlib
import inspect
import itertools

import pytest
import torch
import torch.nn.functional as F

from gatednorm import reference

DTYPES = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="fp16")]


def _inputs(dtype, shape=(2, 5, 64), zero_centered_gamma=False):
    torch.manual_seed(0)
    x = torch.randn(shape).to(dtype)
    gate = (2 * torch.randn(shape)).to(dtype)
    weight = ((0.0 if zero_centered_gamma else 1.0) + 0.2 * torch.randn(shape[-1])).to(dtype)
    dy = torch.randn(shape).to(dtype)
    return x, gate, weight, dy


def _forward_backward(fn, x, gate, weight, dy):
    leaves = [t.clone().requires_grad_() for t in (x, gate, weight)]
    y = fn(*leaves)
    y.backward(dy)
    return [y.detach()] + [t.grad for t in leaves]


def _assert_bitwise(actual, expected, names=("y", "dx", "dgate", "dweight")):
    for name, a, b in zip(names, actual, expected):
        assert a.dtype == b.dtype, f"{name}: {a.dtype} vs {b.dtype}"
        assert torch.equal(a, b), (
            f"{name}: {(a != b).sum().item()} elements differ, "
            f"max {(a.double() - b.double()).abs().max().item():.3e}")


# ---------------------------------------------------------------------------------------------
# (a) Megatron's unfused GDN output norm: TransformerEngine's RMSNorm (fp32 math, output
# rounded to the input dtype; zero-centered gamma scales by 1 + weight in fp32), then
# y = norm * silu(gate.float()) rounded back to x's dtype.


def te_rmsnorm(x, weight, eps, zero_centered_gamma):
    xf = x.float()
    gamma = weight.float() + 1 if zero_centered_gamma else weight.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * rstd * gamma).to(x.dtype)


def megatron_gdn_gated_norm(x, gate, weight, eps=1e-6, zero_centered_gamma=False):
    normed = te_rmsnorm(x, weight, eps, zero_centered_gamma)
    return (normed * F.silu(gate.float())).to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("zero_centered_gamma", [False, True], ids=["weight", "zero_centered"])
def test_te_composite_is_megatrons_unfused_gdn_norm(dtype, zero_centered_gamma):
    x, gate, weight, dy = _inputs(dtype, zero_centered_gamma=zero_centered_gamma)
    expected = _forward_backward(
        lambda x, g, w: megatron_gdn_gated_norm(x, g, w, 1e-6, zero_centered_gamma),
        x, gate, weight, dy)
    actual = _forward_backward(
        lambda x, g, w: reference.te(x, g, w, eps=1e-6, zero_centered_gamma=zero_centered_gamma),
        x, gate, weight, dy)
    _assert_bitwise(actual, expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_te_composite_with_groups_is_megatrons_per_head_norm(dtype):
    # GDN normalizes each head: Megatron reshapes [T, H * D] to [T * H, D] first. Its weight is
    # one [D] vector shared by the heads, the grouped composite's a [H * D] one: only y, dx and
    # dgate are the same quantities (a shared weight's gradient sums the heads before rounding).
    t, h, d = 6, 4, 32
    x, gate, weight, dy = _inputs(dtype, shape=(t, h * d))
    weight = weight[:d].contiguous()

    def megatron(x, g, w):
        return megatron_gdn_gated_norm(x.reshape(-1, d), g.reshape(-1, d), w).reshape(t, h * d)

    def composite(x, g, w):
        return reference.te(x, g, w.repeat(h), group_size=d)

    _assert_bitwise(_forward_backward(composite, x, gate, weight, dy)[:3],
                    _forward_backward(megatron, x, gate, weight, dy)[:3])


@pytest.mark.parametrize("dtype", DTYPES)
def test_te_composite_gate_first_normalizes_the_materialized_gated_input(dtype):
    # Gate first, the unfused graph materializes h = x * act(gate) in x's dtype (the pointwise
    # op computing in fp32) and hands it to TE's RMSNorm.
    x, gate, weight, dy = _inputs(dtype)

    def unfused(x, g, w):
        gated = (x.float() * F.silu(g.float())).to(x.dtype)
        return te_rmsnorm(gated, w, 1e-6, False)

    _assert_bitwise(
        _forward_backward(lambda x, g, w: reference.te(x, g, w, norm_before_gate=False),
                          x, gate, weight, dy),
        _forward_backward(unfused, x, gate, weight, dy))


# ---------------------------------------------------------------------------------------------
# (b) flash-linear-attention's gated norm (and Mamba's rms_norm_ref it descends from): x, gate
# and weight upcast to fp32, every step in fp32, one rounding to x's dtype at the end. Gate
# first (Mamba style) multiplies x by act(gate) before the statistics. The reference code
# writes rstd as 1 / sqrt(...): on CPU that is the same fp32 value as torch.rsqrt.


def fla_rms_norm_gated(x, gate, weight, eps=1e-6, activation="silu", norm_before_gate=True,
                       group_size=None):
    dtype = x.dtype
    xf, zf, wf = x.float(), gate.float(), weight.float()
    act = F.silu(zf) if activation == "silu" else torch.sigmoid(zf)
    if not norm_before_gate:
        xf = xf * act
    group = group_size or xf.shape[-1]
    grouped = xf.reshape(*xf.shape[:-1], xf.shape[-1] // group, group)
    rstd = 1 / torch.sqrt(grouped.square().mean(dim=-1, keepdim=True) + eps)
    out = (grouped * rstd).reshape(xf.shape) * wf
    if norm_before_gate:
        out = out * act
    return out.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation, norm_before_gate, group_size", [
    ("silu", True, None), ("sigmoid", True, None), ("silu", False, None), ("silu", True, 16),
    ("silu", False, 16),
], ids=["silu-norm_first", "sigmoid-norm_first", "silu-gate_first", "silu-norm_first-group16",
        "silu-gate_first-group16"])
def test_fp32_composite_is_fla_forward(dtype, activation, norm_before_gate, group_size):
    # Forward only: flash-linear-attention's backward is its own Triton kernel, not the autograd
    # of this formula; the fp64 accuracy tests cover the gradients.
    x, gate, weight, _ = _inputs(dtype)
    options = dict(activation=activation, norm_before_gate=norm_before_gate,
                   group_size=group_size)
    expected = fla_rms_norm_gated(x, gate, weight, **options)
    actual = reference.fp32(x, gate, weight, **options)
    _assert_bitwise([actual], [expected], names=("y",))


# ---------------------------------------------------------------------------------------------
# (c) The transformers modules themselves.

HF_HIDDEN = 64
# The group size given to gate-first classes whose constructor requires one (all of them from
# transformers 5.23) where the row below names none.
HF_GROUP = 16

# (module path, class names, constructor kwargs, the reference composite and its options).
# A row lists the names a class has had across transformers releases; the first one the
# installed release defines is tested.
TRANSFORMERS_MODULES = [
    ("qwen3_next", ("Qwen3NextRMSNormGated",), {}, "hf", {}),
    ("qwen3_5", ("Qwen3_5RMSNormGated",), {}, "hf", {}),
    ("qwen3_5_moe", ("Qwen3_5MoeRMSNormGated",), {}, "hf", {}),
    ("olmo_hybrid", ("OlmoHybridRMSNormGated",), {}, "hf", {}),
    ("qwen4_exp", ("Qwen4ExpTextRMSNormGated",), {}, "hf", {}),
    ("qwen4_exp", ("Qwen4ExpTextRMSNormGated",), {"activation": "sigmoid"}, "hf",
     {"activation": "sigmoid"}),
    # Renamed from MambaRMSNormGated in transformers 5.23.
    ("mamba2", ("Mamba2RMSNormGated", "MambaRMSNormGated"), {}, "hf",
     {"norm_before_gate": False}),
    ("bamba", ("BambaRMSNormGated",), {}, "hf", {"norm_before_gate": False}),
    ("granitemoehybrid", ("GraniteMoeHybridRMSNormGated",), {}, "hf",
     {"norm_before_gate": False}),
    ("zamba2", ("Zamba2RMSNormGated",), {"group_size": 16}, "hf",
     {"norm_before_gate": False, "group_size": 16}),
    # Nemotron-H's Mamba mixer used Zamba2's class until its own copy (transformers 5.23), with
    # group_size = intermediate / n_groups.
    ("nemotron_h", ("NemotronHRMSNormGated", "Zamba2RMSNormGated"), {"group_size": 32}, "hf",
     {"norm_before_gate": False, "group_size": 32}),
    ("kimi_linear", ("KimiLinearRMSNormGated",), {}, "fp32", {"activation": "sigmoid"}),
    ("glm5_next", ("Glm5NextTextRMSNormGated",), {}, "fp32", {"activation": "sigmoid"}),
    ("bailing_hybrid", ("BailingHybridRMSNormGated",), {}, "fp32", {"activation": "sigmoid"}),
    ("lara_mini", ("LaraMiniRMSNormGated",), {}, "fp32", {}),
    # Falcon-H1 keeps the normalized value in fp32 and multiplies by the (upcast) weight there:
    # the fp32 convention, in either order.
    ("falcon_h1", ("FalconH1RMSNormGated",), {"n_groups": 4, "norm_before_gate": True}, "fp32",
     {"group_size": 16}),
    ("falcon_h1", ("FalconH1RMSNormGated",), {"n_groups": 4, "norm_before_gate": False},
     "fp32", {"group_size": 16, "norm_before_gate": False}),
]


def _module_id(case):
    path, names, kwargs, rounding, _ = case
    extras = "-".join(f"{k}={v}" for k, v in kwargs.items())
    return "-".join(filter(None, [path, names[0], extras, rounding]))


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers", reason="transformers is not installed")


def _installed_class(transformers, path, names):
    """The first class of ``names`` that transformers.models.<path> defines (skip if none)."""
    try:
        modeling = importlib.import_module(f"transformers.models.{path}.modeling_{path}")
    except ImportError:
        pytest.skip(f"transformers {transformers.__version__} has no model {path}")
    for name in names:
        if hasattr(modeling, name):
            return getattr(modeling, name)
    pytest.skip(f"transformers {transformers.__version__} has none of {names} in {path}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", TRANSFORMERS_MODULES, ids=[_module_id(c) for c in
                                                            TRANSFORMERS_MODULES])
def test_composite_equals_transformers_module(transformers, case, dtype):
    path, names, kwargs, rounding, options = case
    cls = _installed_class(transformers, path, names)
    if "group_size" in inspect.signature(cls).parameters and "group_size" not in kwargs:
        kwargs = {**kwargs, "group_size": HF_GROUP}
        options = {**options, "group_size": HF_GROUP}
    module = cls(HF_HIDDEN, eps=1e-6, **kwargs)
    x, gate, weight, dy = _inputs(dtype, shape=(2, 5, HF_HIDDEN))
    with torch.no_grad():
        module.weight.copy_(weight.float())
    module.to(dtype)
    assert module.weight.dtype == dtype

    x_m, gate_m = x.clone().requires_grad_(), gate.clone().requires_grad_()
    y_m = module(x_m, gate_m)
    y_m.backward(dy)
    expected = [y_m.detach(), x_m.grad, gate_m.grad, module.weight.grad]

    composite = getattr(reference, rounding)
    actual = _forward_backward(lambda x, g, w: composite(x, g, w, eps=1e-6, **options),
                               x, gate, module.weight.detach(), dy)
    _assert_bitwise(actual, expected)


def test_transformers_cases_cover_each_installed_gated_norm_class(transformers):
    # A new gated-norm class in transformers should get a row above (or a reason it has none).
    # AXK2GatedRMSNorm is another op (its gate is an MLP of the normalized value): not matched.
    import pathlib

    models = pathlib.Path(transformers.__file__).parent / "models"
    found = set()
    for path in models.glob("*/modeling_*.py"):
        for line in path.read_text().splitlines():
            if line.startswith("class ") and "RMSNormGated(" in line:
                found.add(line.split()[1].split("(")[0])
    covered = {name for _, names, _, _, _ in TRANSFORMERS_MODULES for name in names}
    assert found - covered == set(), f"not covered: {sorted(found - covered)}"


def test_hf_and_fp32_conventions_differ_where_the_reference_says():
    # Guard for the bit-for-bit tests above: the two conventions are distinguishable on these
    # inputs, so matching one of them is not an accident of the data.
    x, gate, weight, _ = _inputs(torch.bfloat16)
    for norm_before_gate in (True, False):
        hf = reference.hf(x, gate, weight, norm_before_gate=norm_before_gate)
        fp32 = reference.fp32(x, gate, weight, norm_before_gate=norm_before_gate)
        te = reference.te(x, gate, weight, norm_before_gate=norm_before_gate)
        assert not torch.equal(hf, fp32) and not torch.equal(te, fp32)


@pytest.mark.parametrize("rounding", ["te", "fp32", "hf"])
@pytest.mark.parametrize("norm_before_gate", [True, False], ids=["norm_first", "gate_first"])
def test_float64_composites_agree(rounding, norm_before_gate):
    # In float64 every rounding is the identity: the three composites are one formula, which is
    # what makes any of them the fp64 ground truth.
    torch.manual_seed(0)
    x, gate = torch.randn(2, 7, 48, dtype=torch.float64), torch.randn(2, 7, 48, dtype=torch.float64)
    weight = 1 + 0.2 * torch.randn(48, dtype=torch.float64)
    for activation, group_size, zero_centered_gamma in itertools.product(
            ("silu", "sigmoid"), (None, 12), (False, True)):
        options = dict(activation=activation, group_size=group_size,
                       zero_centered_gamma=zero_centered_gamma, norm_before_gate=norm_before_gate)
        y = reference.rms_norm_gated(x, gate, weight, rounding=rounding, **options)
        truth = reference.fp32(x, gate, weight, **options)
        torch.testing.assert_close(y, truth, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("rounding, max_ulp", [("te", 2), ("hf", 3), ("fp32", 1)])
def test_reduction_order_alone_moves_the_composite_by_this_many_ulps(rounding, max_ulp):
    """The bound the GPU suite can hold the kernels to against a composite: the composite
    against itself with its mean of squares summed in another order (columns reversed, an
    equally exact fp32 reduction) already differs by up to 2 ulps of bf16 for "te", where an
    intermediate rounded to bf16 can land on either side of a rounding boundary, by 3 for
    "hf" with a bf16 weight (two intermediates rounded: the normalized value and its product
    with the weight), and by 1 ulp for "fp32". No kernel whose reduction order differs from
    PyTorch's can do better than this everywhere (docs/gpu-verification.md)."""
    from tests.gpu.helpers import ulp_distance
    generator = torch.Generator().manual_seed(1)
    rows, d = 65536, 128
    x, gate = (torch.randn(rows, d, generator=generator).bfloat16() for _ in range(2))
    weight = torch.randn(d, generator=generator).bfloat16()
    composite = getattr(reference, rounding)
    y = composite(x, gate, weight)
    y_reordered = composite(x.flip(-1), gate.flip(-1), weight.flip(-1)).flip(-1)
    distance = ulp_distance(y, y_reordered)
    assert (y == y_reordered).float().mean() > 0.9999
    assert distance.max().item() == max_ulp
