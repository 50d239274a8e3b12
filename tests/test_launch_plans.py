"""The launch plans, as literal values: a change of the table or the planner fails here.

Each case was checked equal to the plan the launcher made before the table became named
entries (same kernel, tile, warps, stages, programs, chunking, vector width and row flags);
describe() builds the plan the eager launcher would, on an sm_90 device with 227 KB of shared
memory a block, without tensors or a GPU.
"""

import pytest
import torch
import triton

from gatednorm.kernels import config, plan as planner
from gatednorm.kernels.describe import describe

BF16, FP32 = torch.bfloat16, torch.float32
NORM_FIRST, GATE_FIRST = True, False
TILE, ROW_LOOP, LONG_ROW, BWD = ("forward_tile_kernel", "forward_row_loop_kernel",
                                 "forward_long_row_kernel", "backward_tile_kernel")
H200_SHARED_MEMORY = 232448

# (name, x shape, group size, dtype, norm first, activation, pass) ->
# (kernel, rows, width, tail, warps, stages, programs, rows a chunk, vector elements,
#  launches, row flags: tensors addressed with x's row offsets, rstd stored by PTX)
PLANS = [
    ("gdn128", (4096, 32, 128), 128, BF16, NORM_FIRST, "silu", "fwd",
     (TILE, 16, 128, 0, 4, 1, 8192, None, 8, 1, "gate|y|rstd_by_ptx")),
    ("gdn128", (4096, 32, 128), 128, BF16, NORM_FIRST, "silu", "bwd",
     (BWD, 4, 128, 0, 1, 3, 1024, 128, 8, 3, "gate|dy|dx|dgate")),
    ("gdn128", (4096, 32, 128), 128, FP32, NORM_FIRST, "silu", "fwd",
     (TILE, 16, 128, 0, 4, 1, 8192, None, 8, 1, "-")),
    ("gdn128", (4096, 32, 128), 128, FP32, NORM_FIRST, "silu", "bwd",
     (BWD, 4, 128, 0, 1, 3, 1024, 128, 8, 3, "gate|dy|dx|dgate")),
    ("kimi128", (4096, 96, 128), 128, BF16, NORM_FIRST, "sigmoid", "fwd",
     (TILE, 16, 128, 0, 4, 1, 24576, None, 8, 1, "gate|y|rstd_by_ptx")),
    ("kimi128", (4096, 96, 128), 128, BF16, NORM_FIRST, "sigmoid", "bwd",
     (BWD, 4, 128, 0, 1, 3, 1046, 376, 8, 3, "gate|dy|dx|dgate")),
    ("mamba2_640", (8192, 5120), 640, BF16, GATE_FIRST, "silu", "fwd",
     (TILE, 1, 512, 128, 1, 1, 65536, None, 8, 1, "-")),
    ("mamba2_640", (8192, 5120), 640, BF16, GATE_FIRST, "silu", "bwd",
     (BWD, 1, 512, 128, 1, 3, 1048, 63, 4, 3, "-")),
    ("mamba2_640", (8192, 5120), 640, FP32, GATE_FIRST, "silu", "fwd",
     (TILE, 1, 512, 128, 1, 1, 65536, None, 8, 1, "-")),
    ("mamba2_640", (8192, 5120), 640, FP32, GATE_FIRST, "silu", "bwd",
     (BWD, 1, 512, 128, 1, 3, 1048, 63, 4, 3, "-")),
    ("nemotron_1024", (8192, 8192), 1024, BF16, GATE_FIRST, "silu", "fwd",
     (TILE, 1, 1024, 0, 1, 1, 65536, None, 8, 1, "-")),
    ("nemotron_1024", (8192, 8192), 1024, BF16, GATE_FIRST, "silu", "bwd",
     (BWD, 1, 1024, 0, 2, 3, 528, 125, 8, 3, "-")),
    ("d1", (1048576, 1), 1, BF16, NORM_FIRST, "silu", "fwd",
     (TILE, 1024, 1, 0, 2, 1, 1024, None, 1, 1, "-")),
    ("d1", (1048576, 1), 1, BF16, NORM_FIRST, "silu", "bwd",
     (BWD, 512, 1, 0, 1, 3, 1024, 1024, 1, 3, "gate|dy|dx|dgate")),
    ("d3", (349525, 3), 3, BF16, NORM_FIRST, "silu", "fwd",
     (TILE, 256, 4, 0, 2, 1, 1366, None, 1, 1, "-")),
    ("d3", (349525, 3), 3, BF16, NORM_FIRST, "silu", "bwd",
     (BWD, 128, 4, 0, 1, 3, 911, 384, 1, 3, "gate|dy|dx|dgate")),
    ("d64", (16384, 64), 64, BF16, NORM_FIRST, "silu", "fwd",
     (TILE, 16, 64, 0, 2, 1, 1024, None, 8, 1, "gate|y|rstd_by_ptx")),
    ("d64", (16384, 64), 64, BF16, NORM_FIRST, "silu", "bwd",
     (BWD, 8, 64, 0, 1, 3, 1024, 16, 8, 3, "gate|dy|dx|dgate")),
    ("d96", (10922, 96), 96, BF16, NORM_FIRST, "silu", "fwd",
     (ROW_LOOP, 16, 64, 32, 4, 3, 683, 16, 8, 1, "-")),
    ("d96", (10922, 96), 96, BF16, NORM_FIRST, "silu", "bwd",
     (BWD, 4, 128, 0, 1, 3, 683, 16, 8, 3, "gate|dy|dx|dgate")),
    ("d96", (10922, 96), 96, FP32, NORM_FIRST, "silu", "fwd",
     (TILE, 16, 64, 32, 4, 1, 683, None, 8, 1, "-")),
    ("d96", (10922, 96), 96, FP32, NORM_FIRST, "silu", "bwd",
     (BWD, 4, 128, 0, 1, 3, 683, 16, 8, 3, "gate|dy|dx|dgate")),
    ("d192", (5461, 192), 192, BF16, NORM_FIRST, "silu", "fwd",
     (ROW_LOOP, 16, 128, 64, 8, 3, 342, 16, 8, 1, "-")),
    ("d192", (5461, 192), 192, BF16, NORM_FIRST, "silu", "bwd",
     (BWD, 4, 128, 64, 1, 3, 342, 16, 8, 3, "gate|dy|dx|dgate")),
    ("d2048", (512, 2048), 2048, BF16, NORM_FIRST, "silu", "fwd",
     (TILE, 1, 2048, 0, 2, 1, 512, None, 8, 1, "-")),
    ("d2048", (512, 2048), 2048, BF16, NORM_FIRST, "silu", "bwd",
     (BWD, 1, 2048, 0, 4, 3, 32, 16, 8, 3, "-")),
    ("d4096", (256, 4096), 4096, BF16, NORM_FIRST, "silu", "fwd",
     (TILE, 1, 4096, 0, 4, 1, 256, None, 8, 1, "-")),
    ("d4096", (256, 4096), 4096, BF16, NORM_FIRST, "silu", "bwd",
     (BWD, 1, 4096, 0, 8, 4, 16, 16, 8, 3, "-")),
    ("d8192", (128, 8192), 8192, BF16, NORM_FIRST, "silu", "fwd",
     (ROW_LOOP, 1, 8192, 0, 8, 3, 128, 1, 8, 1, "-")),
    ("d8192", (128, 8192), 8192, BF16, NORM_FIRST, "silu", "bwd",
     (BWD, 1, 8192, 0, 16, 3, 8, 16, 8, 3, "-")),
    ("d8192", (128, 8192), 8192, FP32, NORM_FIRST, "silu", "fwd",
     (TILE, 1, 8192, 0, 8, 1, 128, None, 8, 1, "-")),
    ("d8192", (128, 8192), 8192, FP32, NORM_FIRST, "silu", "bwd",
     (BWD, 1, 8192, 0, 16, 3, 8, 16, 8, 3, "-")),
    ("d16384", (64, 16384), 16384, BF16, NORM_FIRST, "silu", "fwd",
     (ROW_LOOP, 1, 16384, 0, 16, 3, 64, 1, 8, 1, "-")),
    ("d16384", (64, 16384), 16384, BF16, NORM_FIRST, "silu", "bwd",
     (BWD, 1, 2048, 0, 4, 3, 32, 16, 8, 4, "-")),
    ("d32768", (32, 32768), 32768, BF16, NORM_FIRST, "silu", "fwd",
     (LONG_ROW, 1, 4096, 0, 16, 1, 32, None, 8, 1, "-")),
    ("d32768", (32, 32768), 32768, BF16, NORM_FIRST, "silu", "bwd",
     (BWD, 1, 2048, 0, 4, 3, 32, 16, 8, 4, "-")),
    ("decode1_128", (1, 4096), 128, BF16, NORM_FIRST, "silu", "fwd",
     (TILE, 2, 128, 0, 1, 1, 32, None, 8, 1, "gate|y|rstd_by_ptx")),
    ("decode2_128", (2, 4096), 128, BF16, NORM_FIRST, "silu", "fwd",
     (TILE, 2, 128, 0, 1, 1, 32, None, 8, 1, "gate|y|rstd_by_ptx")),
    ("decode4_128", (4, 4096), 128, BF16, NORM_FIRST, "silu", "fwd",
     (TILE, 2, 128, 0, 1, 1, 64, None, 8, 1, "gate|y|rstd_by_ptx")),
    ("decode8_128", (8, 4096), 128, BF16, NORM_FIRST, "silu", "fwd",
     (TILE, 2, 128, 0, 1, 1, 128, None, 8, 1, "gate|y|rstd_by_ptx")),
    ("decode16_128", (16, 4096), 128, BF16, NORM_FIRST, "silu", "fwd",
     (TILE, 2, 128, 0, 1, 1, 256, None, 8, 1, "gate|y|rstd_by_ptx")),
    ("decode32_128", (32, 4096), 128, BF16, NORM_FIRST, "silu", "fwd",
     (TILE, 2, 128, 0, 1, 1, 512, None, 8, 1, "gate|y|rstd_by_ptx")),
]


@pytest.mark.usefixtures("decode_tile")  # the shipped decode rule: plans as shipped
@pytest.mark.parametrize("name, shape, group_size, dtype, norm_first, activation, pass_, "
                         "expected", PLANS,
                         ids=[f"{c[0]}-{c[6]}-{'bf16' if c[3] == BF16 else 'fp32'}"
                              for c in PLANS])
def test_launch_plan(name, shape, group_size, dtype, norm_first, activation, pass_, expected):
    plan = describe(shape, dtype, pass_="forward" if pass_ == "fwd" else "backward",
                    group_size=group_size, activation=activation, norm_before_gate=norm_first)
    flags = "|".join(flag.replace("_ROWS_AS_X", "").lower() for flag in plan.flags) or "-"
    assert (plan.kernel, plan.block_rows, plan.block_n, plan.tail_n, plan.num_warps,
            plan.loop_stages, plan.programs, plan.rows_per_chunk, plan.vector_elements,
            len(plan.launches), flags) == expected
    assert plan.grid == (plan.programs,)


def test_traced_and_inference_forwards_keep_own_offsets_and_tl_store():
    assert describe((4096, 32, 128)).flags == ("GATE_ROWS_AS_X", "Y_ROWS_AS_X", "RSTD_BY_PTX")
    assert describe((4096, 32, 128), traceable=True).flags == ()
    assert describe((4096, 32, 128), store_rstd=False).flags == ()


def test_a_gate_with_other_row_strides_keeps_its_own_offsets():
    # The gate as the second half of each row of a [4096, 32, 256] projection: one leading
    # dim still (rows 256 apart), so y shares x's offsets and rstd goes by PTX.
    plan = describe((4096, 32, 128), gate_strides=(32 * 256, 256, 1))
    assert plan.flags == ("Y_ROWS_AS_X", "RSTD_BY_PTX")
    backward = describe((4096, 32, 128), gate_strides=(32 * 256, 256, 1), pass_="backward")
    assert backward.flags == ("DY_ROWS_AS_X", "DX_ROWS_AS_X", "DGATE_ROWS_AS_X")
    # Sliced across the heads ([4096, 3 * 32 * 128] projection): two leading dims, whose
    # table entry keeps every tensor's own offsets.
    plan = describe((4096, 32, 128), gate_strides=(3 * 32 * 128, 128, 1))
    assert plan.flags == ("RSTD_BY_PTX",)


def test_long_row_backward_is_two_launches_over_column_blocks():
    plan = describe((64, 40000), group_size=20000, pass_="backward")
    assert (plan.block_n, plan.column_blocks) == (2048, 2 * 10)
    assert plan.launches == (BWD, BWD, "dweight_reduce_kernel", "dweight_reduce_kernel")
    assert describe((64, 40000), group_size=20000, pass_="backward",
                    with_weight=False).launches == (BWD, BWD)


def test_describe_names_the_bad_pass():
    with pytest.raises(ValueError, match="pass_"):
        describe((4, 128), pass_="both")


GROUP_SIZES = [1, 3, 64, 96, 128, 192, 640, 1024, 2048, 4096, 5000, 8192, 9000, 16384, 20000,
               65536]


@pytest.mark.parametrize("group_size", GROUP_SIZES)
@pytest.mark.parametrize("loaded", [6, 8, 12, 16], ids=["bf16", "bf16+w", "fp32", "fp32+w"])
@pytest.mark.parametrize("shared_memory", [H200_SHARED_MEMORY, 101376, 49152],
                         ids=["h200", "consumer-99KB", "48KB"])
def test_prefetch_buffers_always_fit_or_prefetch_is_dropped(group_size, loaded, shared_memory):
    fitted = planner.fit_shared_memory(config.backward_config(group_size), loaded,
                                       shared_memory)
    prefetch = ((fitted.loop_stages - 1) * fitted.block_rows * (fitted.block_n + fitted.tail_n)
                * loaded)
    assert fitted.loop_stages == 1 or prefetch + config.SHARED_MEMORY_RESERVE <= shared_memory


@pytest.mark.parametrize("group_size", GROUP_SIZES)
def test_16_bit_inputs_keep_the_tuned_prefetch_depth_on_an_h200(group_size):
    tuned = config.backward_config(group_size)
    assert planner.fit_shared_memory(tuned, 2 * 3, H200_SHARED_MEMORY) == tuned


@pytest.mark.parametrize("group_size", GROUP_SIZES)
def test_tiles_cover_the_group(group_size):
    for tile in (config.forward_config(group_size), config.backward_config(group_size)):
        if tile.long_row:
            assert tile.block_rows == 1 and group_size > tile.block_n
        elif tile.tail_n:  # a head and a tail tile (config.head_and_tail)
            assert tile.block_n < group_size <= tile.block_n + tile.tail_n
        else:
            assert tile.block_n == triton.next_power_of_2(group_size)


def test_every_table_entry_is_reachable_and_keys_match_fields():
    for (pass_, width, kind), entry in config.TABLE.items():
        assert (entry.pass_, entry.width, entry.kind) == (pass_, width, kind)
        assert entry.rows >= 1 and entry.warps >= 1 and entry.stages >= 1
