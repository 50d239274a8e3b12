"""Groups held as a head and a tail tile (config.head_and_tail: 640 = 512 + 128, 96 = 64 + 32)
instead of one tile padded to the next power of two, forward and backward: which groups
split, which table entry they take, and the same accuracy and bits as the padded tile's
contract."""

import pytest
import torch

import gatednorm
from gatednorm.kernels import config, forward as forward_kernels, launch, plan as planner
from gatednorm.kernels.describe import describe
from gatednorm.kernels.backward import backward_tile_kernel
from gatednorm.kernels.config import LaunchConfig

from conftest import (
    assert_finite,
    assert_matches_composite,
    assert_three_way,
    composite,
    dtype_id,
    fp64_truth,
    fused,
    fused_on_views,
    make_inputs,
    rows_of,
)


@pytest.mark.parametrize("group_size, expected", [
    (640, (512, 128)), (96, (64, 32)), (192, (128, 64)), (80, (64, 16)), (48, (32, 16)),
    (520, (512, 8)), (513, (512, 1)),
    # The rest over a quarter of the padded width: no narrower than the padded tile by much.
    (112, None), (1000, None), (769, None),
    # Powers of two need no tail.
    (128, None), (1024, None), (1, None),
], ids=lambda v: str(v))
def test_head_and_tail_widths(group_size, expected):
    assert config.head_and_tail(group_size) == expected
    if expected is not None:
        head, tail = expected
        assert head + tail >= group_size > head and tail <= head // 2


def test_split_entries_replace_the_padded_partial_tile(monkeypatch):
    monkeypatch.setitem(config.TABLE, ("forward", 1024, config.HEAD_TAIL),
                        config.TileEntry("forward", 1024, config.HEAD_TAIL, rows=2, warps=2,
                                         stages=3, programs=999))
    monkeypatch.setitem(config.TABLE, ("forward", 1024, config.PARTIAL),
                        config.TileEntry("forward", 1024, config.PARTIAL, rows=4, warps=4,
                                         stages=3, programs=998))
    assert config.forward_config(640) == LaunchConfig(
        block_rows=2, block_n=512, num_warps=2, long_row=False, loop_stages=3,
        target_programs=999, tail_n=128)
    # A group whose rest needs a 512 tail keeps the padded partial tile...
    assert config.forward_config(900) == LaunchConfig(
        block_rows=4, block_n=1024, num_warps=4, long_row=False, loop_stages=3,
        target_programs=998)
    # ...and so does a whole tile.
    assert config.forward_config(1024).tail_n == 0


def test_backward_split_entries_carry_their_program_count_and_vector_width(monkeypatch):
    # The shipped entries: D = 192 as 128 + 64, four rows, one warp, its own count; Mamba2's
    # 640 as 512 + 128, one row, one warp, its own count, 8-byte vectors of 16-bit data.
    assert config.backward_config(192) == LaunchConfig(
        block_rows=4, block_n=128, num_warps=1, long_row=False, loop_stages=3,
        target_programs=2112, tail_n=64)
    assert config.backward_config(640) == LaunchConfig(
        block_rows=1, block_n=512, num_warps=1, long_row=False, loop_stages=3,
        target_programs=1056, tail_n=128, max_vector_elements=4)
    # Widths without a backward head + tail entry keep the padded partial tile.
    assert config.backward_config(96) == LaunchConfig(
        block_rows=4, block_n=128, num_warps=1, long_row=False, loop_stages=3,
        target_programs=1584)
    monkeypatch.delitem(config.TABLE, ("backward", 1024, config.HEAD_TAIL))
    assert config.backward_config(640) == LaunchConfig(
        block_rows=1, block_n=1024, num_warps=2, long_row=False, loop_stages=3,
        target_programs=792)


def _launched(monkeypatch, flag: str) -> list:
    """(kernel, meta[flag]) of every launch built from now on (None where the kernel has no
    such flag: the dweight reduction)."""
    launched = []
    original = launch.CachedLaunch

    def recording(kernel, meta):
        launched.append((kernel, meta.get(flag)))
        return original(kernel, meta)

    monkeypatch.setattr(launch, "CachedLaunch", recording)
    return launched


@pytest.mark.usefixtures("interpreter")
@pytest.mark.parametrize("row_width, forward_align, backward_align", [
    (1280, 8, 4),  # 16-byte aligned rows: the backward entry caps them at 4 elements
    (1284, 4, 4),  # rows of a wider buffer start at multiples of 4 elements
    (1282, 2, 2),  # ... of 2: under the cap, the layout's own alignment
], ids=["rows_aligned_8", "rows_aligned_4", "rows_aligned_2"])
def test_launches_take_the_narrower_of_layout_and_table_vector_width(
        monkeypatch, row_width, forward_align, backward_align):
    """Mamba2's groups of 640: the shipped backward entry loads 8-byte vectors
    (max_vector_elements 4), the forward as wide as the rows allow; x and gate are read in
    place from buffers ``row_width`` wide."""
    launch.clear_cache()
    launched = _launched(monkeypatch, "ROW_ALIGN")
    x, gate, weight, dy = make_inputs((37, 1280), torch.bfloat16)
    wide_x, wide_gate = (torch.zeros(37, row_width, dtype=torch.bfloat16) for _ in range(2))
    wide_x[:, :1280], wide_gate[:, :1280] = x, gate
    fused_on_views(wide_x[:, :1280], wide_gate[:, :1280], weight, dy, group_size=640,
                   norm_before_gate=False)
    forward_launches = [a for k, a in launched if k is forward_kernels.forward_tile_kernel]
    assert forward_launches == [forward_align]
    assert [a for k, a in launched if k is backward_tile_kernel] == [backward_align]


def test_fit_shared_memory_counts_the_tail(monkeypatch):
    split = LaunchConfig(block_rows=2, block_n=512, num_warps=2, long_row=False, loop_stages=3,
                         tail_n=128)
    # Two prefetched tiles of 2 x 640 elements at 4 bytes an element (x and gate in 16 bits):
    # 10240 bytes; the 512 head alone would be 8192.
    fits = config.SHARED_MEMORY_RESERVE + 10240
    assert planner.fit_shared_memory(split, 4, fits) == split
    assert planner.fit_shared_memory(split, 4, fits - 1).loop_stages == 1


@pytest.mark.usefixtures("decode_tile")
@pytest.mark.parametrize("group_size", [96, 80, 160])
def test_split_groups_keep_their_table_tile_at_decode_sizes(group_size):
    """The decode tile is not taken by a group held as head + tail: its reduction's lanes
    depend on the tile's rows and warps (GPU: rstd bits differ between split tiles), and the
    decode tile must give the table tile's bits."""
    table = config.forward_config(group_size)
    assert table.tail_n
    assert planner.few_rows_forward_config(table, 1, 1) == table


def test_split_tiles_take_no_tile_store_entry():
    """FORWARD_TILE_STORE's entries were measured on whole tiles of their width; a split
    tile's head has that width (96's head is 64) but another kernel schedule."""
    split = describe((4096, 96))
    assert (split.block_n, split.tail_n) == (64, 32)
    assert "RSTD_BY_PTX" not in split.flags
    assert "RSTD_BY_PTX" in describe((4096, 64)).flags


# (shape, group_size, norm_before_gate): rows not a multiple of any tile height.
SPLIT_SHAPES = [
    pytest.param((2, 25, 96), None, True, id="d96"),
    pytest.param((37, 192), None, True, id="d192"),
    pytest.param((3, 13, 1280), 640, False, id="groups640-gate_first"),
    pytest.param((50, 160), 80, False, id="groups80-gate_first"),
    pytest.param((41, 520), None, True, id="d520-tail8"),
]
OPTIONS = [
    pytest.param(dict(rounding="te"), True, id="te-silu-weight"),
    pytest.param(dict(rounding="hf", activation="sigmoid"), True, id="hf-sigmoid-weight"),
    pytest.param(dict(rounding="fp32", zero_centered_gamma=True), True, id="fp32-zero_centered"),
    pytest.param(dict(rounding="te"), False, id="te-no_weight"),
]


def _split_table(monkeypatch, stages: int, backward: bool = True) -> None:
    """Every padded width the shapes above use held as head + tail, at ``stages`` (forward
    1: the one-tile kernel, 2: the row loop; the backward's loop prefetches stages + 1 deep),
    in the backward too unless ``backward`` is False."""
    tiles = {("forward", 128): (4, 2, stages), ("forward", 256): (4, 2, stages),
             ("forward", 1024): (2, 2, stages)}
    if backward:
        tiles.update({("backward", 128): (4, 1, stages + 1),
                      ("backward", 256): (2, 2, stages + 1),
                      ("backward", 1024): (2, 2, stages + 1)})
    for key in [key for key in config.TABLE if key[2] == config.HEAD_TAIL]:
        monkeypatch.delitem(config.TABLE, key)
    for (pass_, width), (rows, warps, stages_) in tiles.items():
        monkeypatch.setitem(config.TABLE, (pass_, width, config.HEAD_TAIL), config.TileEntry(
            pass_, width, config.HEAD_TAIL, rows=rows, warps=warps, stages=stages_))
    launch.clear_cache()


@pytest.mark.usefixtures("interpreter")
@pytest.mark.parametrize("stages", [1, 2], ids=["tile", "row_loop"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=dtype_id)
@pytest.mark.parametrize("options, has_weight", OPTIONS)
@pytest.mark.parametrize("shape, group_size, norm_before_gate", SPLIT_SHAPES)
def test_split_forward_is_as_accurate_as_the_composite(monkeypatch, shape, group_size,
                                                       norm_before_gate, options, has_weight,
                                                       dtype, stages):
    _split_table(monkeypatch, stages)
    launched = _launched(monkeypatch, "TAIL_N")
    options = dict(options, group_size=group_size, norm_before_gate=norm_before_gate)
    x, gate, weight, dy = make_inputs(shape, dtype, has_weight=has_weight,
                                      zero_centered_gamma=options.get("zero_centered_gamma",
                                                                      False))
    kernel = fused(x, gate, weight, dy, **options)
    head, tail = config.head_and_tail(group_size or shape[-1])
    forward_launches = [(k, t) for k, t in launched if k in (
        forward_kernels.forward_tile_kernel, forward_kernels.forward_row_loop_kernel)]
    assert [t for k, t in launched if k is backward_tile_kernel] == [tail]
    # fp32 inputs keep the one-tile kernel (launch.forward), with the tail all the same.
    expected_kernel = (forward_kernels.forward_row_loop_kernel
                       if stages > 1 and dtype != torch.float32
                       else forward_kernels.forward_tile_kernel)
    assert forward_launches == [(expected_kernel, tail)]
    assert_finite(kernel)
    assert_three_way(kernel, composite(x, gate, weight, dy, **options),
                     fp64_truth(x, gate, weight, dy, **options), rows_of(shape))
    assert_matches_composite(kernel, composite(x, gate, weight, dy, **options), dtype)


@pytest.mark.usefixtures("interpreter")
@pytest.mark.parametrize("shape, group_size, norm_before_gate", SPLIT_SHAPES)
def test_split_row_loop_and_tile_kernel_give_the_same_bits(monkeypatch, shape, group_size,
                                                           norm_before_gate):
    """The row loop and the one-tile kernel do the same arithmetic per tile, tail included;
    so do the training forward (rstd stored) and the inference one."""
    x, gate, weight, _ = make_inputs(shape, torch.float16)
    options = dict(group_size=group_size, norm_before_gate=norm_before_gate, rounding="te")
    outputs = {}
    for stages in (1, 2):
        _split_table(monkeypatch, stages)
        with torch.no_grad():
            outputs[stages, "inference"] = gatednorm.rms_norm_gated(x, gate, weight, **options)
        outputs[stages, "training"] = gatednorm.rms_norm_gated(
            x, gate, weight.requires_grad_(), **options).detach()
        weight = weight.detach()
    first = outputs[1, "inference"]
    for key, y in outputs.items():
        assert torch.equal(y, first), key


@pytest.mark.usefixtures("interpreter")
def test_split_rstd_feeds_the_padded_backward(monkeypatch):
    """The backward keeps the padded tile and reads the forward's rstd: gradients of a split
    forward equal those of a padded one wherever the two rstd agree (here: all, fp16)."""
    shape, options = (3, 13, 1280), dict(group_size=640, norm_before_gate=False, rounding="te")
    x, gate, weight, dy = make_inputs(shape, torch.float16)
    for key in [key for key in config.TABLE if key[2] == config.HEAD_TAIL]:
        monkeypatch.delitem(config.TABLE, key)
    launch.clear_cache()
    padded = fused(x, gate, weight, dy, **options)
    _split_table(monkeypatch, 2, backward=False)
    split = fused(x, gate, weight, dy, **options)
    for (name, a), (_, b) in zip(split.named(), padded.named()):
        assert torch.equal(a, b), name


@pytest.mark.usefixtures("interpreter")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=dtype_id)
@pytest.mark.parametrize("options, has_weight", OPTIONS)
def test_shipped_capped_vector_backward_is_as_accurate_as_the_composite(options, has_weight,
                                                                        dtype):
    """The shipped table on Mamba2's groups of 640 (a backward of 8-byte vectors: row offsets
    stepped in units of 4 elements) against fp64 and the composite."""
    launch.clear_cache()
    assert config.backward_config(640).max_vector_elements == 4
    shape = (3, 13, 1280)
    options = dict(options, group_size=640, norm_before_gate=False)
    x, gate, weight, dy = make_inputs(shape, dtype, has_weight=has_weight,
                                      zero_centered_gamma=options.get("zero_centered_gamma",
                                                                      False))
    kernel = fused(x, gate, weight, dy, **options)
    assert_finite(kernel)
    assert_three_way(kernel, composite(x, gate, weight, dy, **options),
                     fp64_truth(x, gate, weight, dy, **options), rows_of(shape))
    assert_matches_composite(kernel, composite(x, gate, weight, dy, **options), dtype)
