"""The decode tile: forwards over too few rows to fill the GPU with the table's tile take a
one-warp tile of FEW_ROWS_TILE_ELEMENTS elements (plan.few_rows_forward_config), with the
same bits."""

import pytest
import torch

import gatednorm
from gatednorm.kernels import config, launch, plan as planner
from gatednorm.kernels.config import LaunchConfig

pytestmark = pytest.mark.usefixtures("decode_tile")


def _decode(block_rows: int, block_n: int) -> LaunchConfig:
    return LaunchConfig(block_rows=block_rows, block_n=block_n, num_warps=1, long_row=False)


@pytest.mark.parametrize("group_size, rows, num_groups, expected", [
    # 32 rows of 128 (one decode token x 32 heads): 2 table tiles -> 16 two-row programs.
    (128, 32, 1, _decode(2, 128)),
    # 2048 rows: 128 table programs, under one per SM.
    (128, 2048, 1, _decode(2, 128)),
    # Narrow and partial groups: the same element count per program.
    (64, 10, 1, _decode(4, 64)),
    (112, 7, 1, _decode(2, 128)),
    (3, 1, 1, _decode(64, 4)),
], ids=["d128-32rows", "d128-2048rows", "d64", "d112-partial-tile", "d3"])
def test_few_rows_take_the_decode_tile(group_size, rows, num_groups, expected):
    table = config.forward_config(group_size)
    assert planner.few_rows_forward_config(table, rows, num_groups) == expected


@pytest.mark.parametrize("group_size, rows, num_groups", [
    (128, 2112, 1),   # 132 table programs: one per SM
    (128, 1024, 4),   # four groups per row multiply the programs
    (256, 8, 1),      # wider tiles keep the table (not measured at decode sizes)
    (1024, 1, 8),
    (20000, 1, 1),    # long rows
], ids=["d128-2112rows", "d512-4groups", "d256", "d8192-8groups", "long-row"])
def test_enough_programs_or_wider_tiles_keep_the_table(group_size, rows, num_groups):
    table = config.forward_config(group_size)
    assert planner.few_rows_forward_config(table, rows, num_groups) == table


def test_zero_turns_the_decode_tile_off(monkeypatch):
    monkeypatch.setattr(config, "FORWARD_FEW_PROGRAMS", 0)
    table = config.forward_config(128)
    assert planner.few_rows_forward_config(table, 1, 1) == table


@pytest.mark.usefixtures("interpreter")
@pytest.mark.parametrize("shape, group_size, options", [
    ((1, 32, 128), None, dict(rounding="te")),
    ((3, 5, 112), None, dict(rounding="hf", activation="sigmoid")),
    ((4, 256), 64, dict(rounding="fp32", norm_before_gate=False, zero_centered_gamma=True)),
], ids=["decode-d128-te", "d112-hf-sigmoid", "groups64-gate-first-fp32"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_decode_tile_gives_the_table_tiles_bits(monkeypatch, shape, group_size, options, dtype):
    x = torch.randn(shape).to(dtype)
    gate = (2 * torch.randn(shape)).to(dtype)
    weight = (1 + 0.2 * torch.randn(shape[-1])).to(dtype)
    with torch.no_grad():
        decode = gatednorm.rms_norm_gated(x, gate, weight, group_size=group_size, **options)
    (plan,) = launch.cached_plans("fwd")
    assert (plan.meta["BLOCK_ROWS"] * plan.meta["BLOCK_N"], plan.meta["num_warps"]) == (
        config.FEW_ROWS_TILE_ELEMENTS, 1)

    monkeypatch.setattr(config, "FORWARD_FEW_PROGRAMS", 0)
    launch.clear_cache()
    with torch.no_grad():
        table = gatednorm.rms_norm_gated(x, gate, weight, group_size=group_size, **options)
    (plan,) = launch.cached_plans("fwd")
    assert plan.meta["num_warps"] > 1
    assert torch.equal(decode, table)
