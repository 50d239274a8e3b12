"""The launch table: which configuration each group size and dtype gets (no GPU needed)."""

import pytest
import triton

from gatednorm.kernels import config

H200_SHARED_MEMORY = 232448
GROUP_SIZES = [3, 64, 96, 128, 192, 640, 1024, 2048, 4096, 5000, 8192, 9000, 16384, 20000, 65536]


def _prefetch_bytes(launch, loaded_bytes_per_element):
    return ((launch.loop_stages - 1) * launch.block_rows * launch.block_n
            * loaded_bytes_per_element)


@pytest.mark.parametrize("group_size", GROUP_SIZES)
def test_16_bit_inputs_keep_the_tuned_prefetch_depth_on_an_h200(group_size):
    tuned = config.backward_config(group_size)
    # x, gate, dy in bf16 (the weight is loaded once per program, outside the loop).
    assert config.fit_shared_memory(tuned, 2 * 3, H200_SHARED_MEMORY) == tuned


@pytest.mark.parametrize("group_size", GROUP_SIZES)
@pytest.mark.parametrize("loaded", [6, 8, 12, 16], ids=["bf16", "bf16+w", "fp32", "fp32+w"])
@pytest.mark.parametrize("shared_memory", [H200_SHARED_MEMORY, 101376, 49152],
                         ids=["h200", "consumer-99KB", "48KB"])
def test_prefetch_buffers_always_fit_or_prefetch_is_dropped(group_size, loaded, shared_memory):
    fitted = config.fit_shared_memory(config.backward_config(group_size), loaded, shared_memory)
    assert (fitted.loop_stages == 1
            or _prefetch_bytes(fitted, loaded) + config.SHARED_MEMORY_RESERVE <= shared_memory)


def test_fp32_long_rows_keep_prefetching_on_an_h200():
    # The column blocks of a long row's backward are tiles like any other: fp32 x, gate and
    # dy fit the prefetch buffers (the looped kernel before them also loaded the weight in
    # both of its loops, and dropped prefetching in fp32).
    long_row = config.backward_config(20000)
    assert long_row.long_row and long_row.loop_stages > 1
    assert config.fit_shared_memory(long_row, 12, H200_SHARED_MEMORY) == long_row


@pytest.mark.parametrize("group_size", GROUP_SIZES)
def test_tiles_cover_the_group(group_size):
    for launch in (config.forward_config(group_size), config.backward_config(group_size)):
        if launch.long_row:
            assert launch.block_rows == 1 and group_size > launch.block_n
        elif launch.tail_n:  # a head and a tail tile (config.head_and_tail)
            assert launch.block_n < group_size <= launch.block_n + launch.tail_n
        else:
            assert launch.block_n == triton.next_power_of_2(group_size)
        assert launch.loop_stages >= 1


@pytest.mark.parametrize("group_size", [640, 768, 900, 1000, 1200, 1536])
def test_groups_filling_part_of_their_tile_take_the_partial_tile_entry(group_size):
    block_n = triton.next_power_of_2(group_size)
    # The forward holds a group that fits a head and a tail tile that way (variant 40).
    forward_partial = (config.FORWARD_SPLIT_TILES if config.head_and_tail(group_size)
                       else config.FORWARD_PARTIAL_TILES)
    # ... and the backward where its split table has an entry (variants 41, 42).
    backward_partial = (config.BACKWARD_SPLIT_TILES if config.head_and_tail(group_size)
                        and block_n in config.BACKWARD_SPLIT_TILES
                        else config.BACKWARD_PARTIAL_TILES)
    for tuned, partial, whole in (
            (config.forward_config(group_size), forward_partial, config.FORWARD_TILES),
            (config.backward_config(group_size), backward_partial, config.BACKWARD_TILES)):
        # A width without a partial entry takes the whole tile's (the backward's 1024 since
        # variant 38); its program count may still be the partial one.
        rows, warps, stages = partial.get(block_n, whole[block_n])[:3]
        assert (tuned.block_rows, tuned.num_warps, tuned.loop_stages) == (rows, warps, stages)
    # A full tile of the same width keeps the main table's entry.
    assert config.forward_config(block_n).block_rows == config.FORWARD_TILES[block_n][0]


@pytest.mark.parametrize("group_size, expected", [
    (128, config.BACKWARD_TARGET_PROGRAMS), (2048, config.BACKWARD_TILE_TARGET_PROGRAMS[2048]),
    (1024, config.BACKWARD_TILE_TARGET_PROGRAMS[1024]),
    (640, config.BACKWARD_SPLIT_TILES[1024][3]),
    (900, config.BACKWARD_PARTIAL_TILE_TARGET_PROGRAMS[1024]),
    (1536, config.BACKWARD_PARTIAL_TILE_TARGET_PROGRAMS[2048]),
    (96, config.BACKWARD_PARTIAL_TILE_TARGET_PROGRAMS[128]),
    (192, config.BACKWARD_SPLIT_TILES[256][3]),
    (256, config.BACKWARD_TILE_TARGET_PROGRAMS[256]),
    (64, config.BACKWARD_TILE_TARGET_PROGRAMS[64]), (48, config.BACKWARD_TILE_TARGET_PROGRAMS[64]),
    (32, config.BACKWARD_TILE_TARGET_PROGRAMS[32]), (16, config.BACKWARD_TARGET_PROGRAMS),
    (512, config.BACKWARD_TILE_TARGET_PROGRAMS[512]),
    (4096, config.BACKWARD_TILE_TARGET_PROGRAMS[4096]),
    (5000, config.BACKWARD_PARTIAL_TILE_TARGET_PROGRAMS[8192]),
    (8192, config.BACKWARD_TILE_TARGET_PROGRAMS[8192]), (20000, config.BACKWARD_TARGET_PROGRAMS),
], ids=["d128", "d2048-own-target", "d1024-own-target", "d640-split-own-target",
        "d900-partial-own-target", "d1536-partial-own-target",
        "d96-partial-own-target", "d192-split-own-target", "d256-own-target",
        "d64-narrow-own-target", "d48-narrow-takes-the-64-target",
        "d32-narrow-own-target", "d16-narrow-default", "d512", "d4096",
        "d5000-partial", "d8192", "long-row"])
def test_backward_tiles_take_their_program_target(group_size, expected):
    tile = config.backward_config(group_size)
    assert config.backward_target_programs(tile) == expected
    rows_per_chunk, num_chunks = config.backward_chunking(6144, 1, tile.block_rows, expected)
    assert num_chunks <= expected and num_chunks * rows_per_chunk >= 6144


@pytest.mark.parametrize("group_size, target", [
    (8192, config.FORWARD_TILE_TARGET_PROGRAMS[8192]),
    (5000, config.FORWARD_PARTIAL_TILE_TARGET_PROGRAMS[8192]),
    (96, config.FORWARD_TARGET_PROGRAMS), (192, config.FORWARD_TARGET_PROGRAMS),
    (1000, config.FORWARD_TARGET_PROGRAMS)])
def test_forward_row_loops_take_their_program_target(group_size, target):
    tile = config.forward_config(group_size)
    assert tile.loop_stages > 1 and not tile.long_row  # a row-loop entry of the table
    assert config.forward_target_programs(tile) == target
    # About that many programs: chunks are whole tiles, so the count rounds down a little.
    _, num_chunks = config.forward_chunking(1 << 20, 1, tile.block_rows, target)
    assert 0.9 * target < num_chunks <= target
