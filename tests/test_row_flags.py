"""Launch flags that change how a kernel computes, never what: shared row offsets (a tensor
whose row strides equal x's is addressed with x's offsets) and the forward's rstd store placed
before y (by inline PTX on a GPU; by tl.store in the interpreter, which has no PTX).

Every combination is forced on every layout and checked bit for bit against the launch the
table picks, and that one against fp64; the table's choices are checked where they are made.
"""

import pytest
import torch

import gatednorm
from gatednorm.kernels import config, launch, layout, plan as planner

from conftest import (
    assert_finite,
    assert_three_way,
    composite,
    fp64_truth,
    fused_on_views,
    make_inputs,
)

pytestmark = pytest.mark.usefixtures("interpreter")


def _plans(kind: str) -> list:
    return launch.cached_plans(kind)


def _layout_inputs(case: str, dtype: torch.dtype, d: int = 128):
    """x, gate, weight, dy of 5 x 6 rows of d, laid out as ``case`` says."""
    x, gate, weight, dy = make_inputs((5, 6, d), dtype)
    if case == "sliced_gate":
        projection = torch.randn(5, 3 * 6 * d).to(dtype)
        projection[:, 6 * d:2 * 6 * d] = gate.reshape(5, -1)
        gate = projection[:, 6 * d:2 * 6 * d].view(5, 6, d)
    elif case == "permuted_x":
        x = x.transpose(0, 1).contiguous().transpose(0, 1)
    return x, gate, weight, dy


class _Always:
    """Stands in for config.FORWARD_TILE_STORE: the same choice for every tile and dtype."""

    def __init__(self, choice):
        self.choice = config.StoreChoice(*choice)

    def get(self, key, default=None):
        return self.choice


def test_rows_as_first_marks_the_tensors_laid_out_like_the_first():
    x = torch.randn(4, 6, 128)
    projection = torch.randn(4, 3 * 6 * 128)
    sliced = projection[:, 6 * 128:2 * 6 * 128].view(4, 6, 128)
    permuted = torch.randn(6, 4, 128).transpose(0, 1)
    y = torch.empty_like(x)
    assert layout.row_layout([x, x.clone(), y], 128).rows_as_first == (True, True, True)
    assert layout.row_layout([x, sliced, y], 128).rows_as_first == (True, False, True)
    assert layout.row_layout([permuted, x, y], 128).rows_as_first == (True, False, False)


@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32],
                         ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("block_n", [64, 128, 256, 1024])
def test_forward_store_choice_comes_from_the_table_for_training_eager_launches(
        monkeypatch, dtype, block_n, activation):
    tile = config.LaunchConfig(block_rows=4, block_n=block_n, num_warps=4, long_row=False)
    monkeypatch.setattr(config, "forward_config", lambda group_size: tile)

    def store(leading_dims, store_rstd, traceable):
        return planner.plan_forward(block_n, 4096, 1, x_dtype=dtype, gate_dtype=dtype,
                                    activation=activation, leading_dims=leading_dims,
                                    store_rstd=store_rstd, traceable=traceable,
                                    shared_memory_bytes=config.DEFAULT_SHARED_MEMORY_BYTES).store

    for leading_dims in (1, 2, 3):
        sliced = leading_dims > 1
        expected = config.FORWARD_TILE_STORE.get((block_n, dtype, activation, sliced),
                                                 config.NO_STORE_CHOICE)
        assert store(leading_dims, True, False) == expected
        # No rstd (inference) and traced launches (whose stores torch.compile must see)
        # keep tl.store after y and each tensor's own offsets.
        assert store(leading_dims, False, False) == config.NO_STORE_CHOICE
        assert store(leading_dims, True, True) == config.NO_STORE_CHOICE


@pytest.mark.parametrize("group_size, leading_dims, expected", [
    (128, 1, True), (96, 1, True), (256, 1, True), (192, 1, True),
    (128, 2, False), (128, 3, False), (1024, 1, False),
    (224, 1, False),  # the padded partial 256 tile measured slower with shared offsets
])
def test_backward_shares_row_offsets_on_multi_row_tiles_with_one_leading_dim(
        group_size, leading_dims, expected):
    tile = config.backward_config(group_size)
    assert planner.shares_row_offsets(tile, leading_dims) is expected


@pytest.mark.parametrize("case, activation, forward_flags, backward_flags", [
    ("contiguous", "silu", (True, True, True), (True, True, True, True)),
    ("sliced_gate", "silu", (True, False, False), (False, False, False, False)),
    ("sliced_gate", "sigmoid", (True, False, True), (False, False, False, False)),
    ("permuted_x", "silu", (True, False, False), (False, False, False, False)),
])
def test_launch_flags_of_a_bf16_gdn_step(monkeypatch, case, activation, forward_flags,
                                         backward_flags):
    launch.clear_cache()
    fused_on_views(*_layout_inputs(case, torch.bfloat16), activation=activation)
    (forward_plan,), (backward_plan,) = _plans("fwd"), _plans("bwd")
    meta = forward_plan.meta
    assert (meta["RSTD_BY_PTX"], meta["GATE_ROWS_AS_X"], meta["Y_ROWS_AS_X"]) == forward_flags
    meta = backward_plan.meta
    assert (meta["GATE_ROWS_AS_X"], meta["DY_ROWS_AS_X"], meta["DX_ROWS_AS_X"],
            meta["DGATE_ROWS_AS_X"]) == backward_flags


def test_inference_launch_keeps_own_offsets_and_no_rstd(monkeypatch):
    launch.clear_cache()
    x, gate, weight, _ = _layout_inputs("contiguous", torch.bfloat16)
    with torch.no_grad():
        gatednorm.rms_norm_gated(x, gate, weight)
    (plan,) = [p for p in _plans("fwd")]
    assert not plan.meta["STORE_RSTD"]
    assert not (plan.meta["RSTD_BY_PTX"] or plan.meta["GATE_ROWS_AS_X"]
                or plan.meta["Y_ROWS_AS_X"])


OPTIONS = [
    pytest.param(dict(rounding="te"), id="te-norm_first"),
    pytest.param(dict(rounding="hf", norm_before_gate=False, group_size=32),
                 id="hf-gate_first-group32"),
]


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("case", ["contiguous", "sliced_gate", "permuted_x"])
@pytest.mark.parametrize("by_ptx, shared", [(False, False), (True, False), (False, True),
                                            (True, True)],
                         ids=["store_after_y-own_rows", "store_first-own_rows",
                              "store_after_y-shared_rows", "store_first-shared_rows"])
@pytest.mark.parametrize("d", [128, 1024], ids=["d128", "d1024"])
def test_every_store_and_row_choice_gives_the_same_bits(monkeypatch, options, case, by_ptx,
                                                        shared, d):
    inputs = _layout_inputs(case, torch.float16, d)
    launch.clear_cache()
    chosen = fused_on_views(*inputs, **options)
    assert_finite(chosen)
    assert_three_way(chosen, composite(*inputs, **options), fp64_truth(*inputs, **options),
                     30)

    monkeypatch.setattr(config, "FORWARD_TILE_STORE", _Always((by_ptx, shared)))
    monkeypatch.setattr(planner, "shares_row_offsets", lambda *args: shared)
    launch.clear_cache()
    forced = fused_on_views(*inputs, **options)
    (forward_plan,), (backward_plan,) = _plans("fwd"), _plans("bwd")
    assert forward_plan.meta["RSTD_BY_PTX"] is by_ptx
    # The launcher shares only what the strides allow: y is laid out like x unless x is
    # permuted, the gate only when neither is sliced nor permuted.
    assert forward_plan.meta["Y_ROWS_AS_X"] is (shared and case != "permuted_x")
    assert forward_plan.meta["GATE_ROWS_AS_X"] is (shared and case == "contiguous")
    assert backward_plan.meta["DX_ROWS_AS_X"] is (shared and case != "permuted_x")
    for name, value in forced.named():
        assert torch.equal(value, getattr(chosen, name)), f"{name} changed with the flags"
