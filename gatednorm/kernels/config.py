"""Launch configurations: a small table keyed by group size, no autotuning.

Autotuning on the hot path is slow on the first call and can pick differently from run to run,
which would also change dweight's bits (the chunking depends on the tile). The numbers here
were chosen on an H200 (docs/perf-notes.md has the measurements behind them).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton

# Measured best (block_rows, num_warps, loop_stages) per power-of-two tile width, bf16, on an
# H200 (docs/perf-notes.md, benchmarks/results/h200-2026-12-02-launch-sweep-v*.json).
# Forward groups up to 16384 elements stay in registers; the backward keeps about three times
# as many live values and cuts groups wider than 8192 into column blocks (two launches). The
# backward's loop over its chunk's rows is software-pipelined (loop_stages tiles of loads in
# flight per program): without it a program waits on every tile's loads, and the backward
# stayed under 75 % of copy bandwidth.
# A forward entry with loop_stages > 1 runs forward_row_loop_kernel: resident programs that
# walk their chunk of rows tile by tile with that many tiles of x and gate in flight (the
# one-tile kernel has nothing to overlap a tile's loads with). The forward 1024 tile takes one
# warp a row: 74.5-74.7 us against 78.3-78.6 us for two warps at D = 1024 in two sweeps timed
# as the benchmark times (launch-sweep-v6-cold-fwd, -cold-fwd-1024).
# The 64 tile (and so every narrower group, as many rows as it holds elements) takes 16 rows
# and 2 warps: 74.1 us against 78.1 us for 32 rows and 4 warps at D = 64 bf16, cold
# (h200-2026-12-03-launch-sweep-v7-d64.json).
FORWARD_TILES = {
    64: (16, 2, 1), 128: (16, 4, 1), 256: (4, 2, 1), 512: (4, 4, 1), 1024: (1, 1, 1),
    2048: (1, 2, 1), 4096: (1, 4, 1), 8192: (1, 8, 3), 16384: (1, 16, 3),
}
# The backward's 64 and 256 tiles were swept again with 2-16 rows, 1-2 warps, 3-4 stages and
# 528-1584 programs (variant 43, cold, two rounds each, h200-2026-12-03-launch-sweep-v13-bwd-
# tiles-*): D = 256 two rows 177.6 / 177.2 us against 184.0 / 183.9 for four (fp16 176.7 /
# 177.5 against 195.7 / 193.9; at a quarter of the rows 39.2 against 40.3; D = 224 168.9
# against 172.6) -> two rows. D = 64 four rows, 4 stages won at the benchmark's 786432 rows
# (135.5 against 140.9 us) but lost at 262144 and 196608 (50.2 / 39.5 against 49.1 / 38.5),
# and so did the narrower groups it would carry (D = 32 at 393216 rows 40.0 against 38.7):
# the 64 tile keeps the 128 tile's rows and stages. The same sweep kept the 128 tile at GDN
# 4096 x 32 and the 2048 tile (four warps at 1584: 1 %) at 32768 rows. At the benchmark's
# 24576 rows (variant 52, h200-2026-12-04-launch-sweep-v17-bwd-d2048-24576r-r1/-r2, cold, two
# rounds) the two-warp tile at 1056 programs (1024 chunks of 24 rows, 255 registers) took
# 145.7 / 146.0 us against 135.9 / 136.0 for four warps at 1584 (1536 chunks, 128-138 regs):
# four warps at 1584, faster at both row counts, in fp16 (135.8 against 144.1 / 144.3) and
# gate first, where two warps spill 46 registers (143.2 / 145.1 against 182.8 / 181.4 at
# 1056 / 1584; launch-sweep-v17b-*). Groups of 1025-2047 take it too: at D = 1536 gate
# first 159.4 us against 198.8-204.2 for two warps (spilling), norm first 141.4 against 135.5
# (4 % slower; the table has no key for the gate's order; launch-sweep-v17c-*).
BACKWARD_TILES = {
    128: (4, 1, 3), 256: (2, 1, 3), 512: (2, 2, 4), 1024: (1, 2, 3), 2048: (1, 4, 3),
    4096: (1, 8, 4), 8192: (1, 16, 3),
}
# Groups that fill only part of their tile (D 96 of 128, 192 of 256, Mamba2's 640 of 1024):
# the same instructions per tile move fewer bytes. Two rows per program measured 8-10 points
# of copy bandwidth better than one (launch-sweep-v4), and the forward's row loop another 3-11
# points over the one-tile kernel (launch-sweep-v5 round 2: D 96 87.5 -> 94.7 %, 192 83.9 ->
# 95.0 %, 640 84.3 -> 87.1 %). Full tiles of 128-4096 measured the one-tile kernel faster.
# The backward's partial 1024 tile took two rows and 4 warps until its program count was
# swept with it (variant 38): one row and 2 warps (the whole tile's entry) at 792 programs ran
# Mamba2 in 123.2 us against 128.3 for the best count of the two-row tile (396), and 66.0
# against 67.6 at 4096 tokens (launch-sweep-v9, two rounds each); so no backward entry is left.
FORWARD_PARTIAL_TILES = {128: (16, 4, 3), 256: (8, 4, 3), 1024: (2, 2, 3)}
BACKWARD_PARTIAL_TILES: dict[int, tuple[int, int, int]] = {}
# The backward's head + tail entries (variant 41), as FORWARD_SPLIT_TILES, with a fourth
# element where the tile has a program count of its own (else the partial tile's count) and
# a fifth where its loads are capped at that many elements (LaunchConfig.max_vector_elements).
# Cold sweeps, two rounds (h200-2026-12-03-launch-sweep-v12-bwd-split-*), adopted only over
# 3 % in both: D = 192 (128 + 64) four rows, one warp, 2112 programs 137.2 / 138.9 us against
# 148.0 / 148.1 for the padded 4 x 256 tile at its 1584 (two rows at 1056: 139.0 / 139.2).
# Mamba2 (640 = 512 + 128), one row, one warp: with 16-byte vectors 120.3 / 120.4 us at 1056
# against 123.6 / 123.0 for the padded tile at its 792, under 3 % (the split tile's cp.async
# prefetch makes Triton recompute the head in the tail's layout, as in the forward's row
# loop); with 8-byte vectors the 128-wide tail on one warp has the head's register layout
# (variant 42): 118.0 / 117.2 us at 1056 -> adopted; at 4096 tokens 60.2 against 65.3. At
# 245 registers eight one-warp programs fit an SM, so 1056 is one full wave (792: 122.7,
# 1584: 131.6; two warps or two rows: 130.5 or slower; launch-sweep-v13-bwd-vec-*).
# Not adopted: D = 96 eight rows, one warp at 2112 139.3 / 139.4 against 140.4 (narrower
# vectors only add instructions there: a 32-wide tail matches the head's layout at one element
# a lane).
BACKWARD_SPLIT_TILES: dict[int, tuple[int, ...]] = {256: (4, 1, 3, 2112),
                                                    1024: (1, 1, 3, 1056, 4)}
# Partial groups held as a head and a tail tile (variant 40, head_and_tail: 640 = 512 + 128,
# 96 = 64 + 32, 192 = 128 + 64), keyed by the padded width; (block_rows, num_warps,
# loop_stages) with block_rows x (head + tail) elements a tile. Overrides FORWARD_PARTIAL_TILES
# where it applies: no lane holds padding, 20-35 % fewer instructions an element. Cold sweeps,
# two rounds each (h200-2026-12-03-launch-sweep-v11-fwd-split-*), against the padded entries:
#   Mamba2 (640 = 512 + 128, gate first): one row, one warp, the one-tile kernel 63.6-63.8 us
#     against 74.3-74.5 for the padded row loop (4096 tokens: 34.4 against 40.4). The split
#     row loop was slower (77-82 us): with its tiles read from shared memory Triton computes
#     the head a second time in the tail's layout (offline SASS: 707 loop instructions
#     against 521 without the prefetch).
#   D = 96 (64 + 32): 16 x 96, 4 warps, row loop 78.3-78.4 us against 81.3-81.4 (32 x 8 warps
#     78.1; the one-tile kernel 81.4-88).
#   D = 192 (128 + 64): 16 x 192, 8 warps, row loop 76.7 us against 80.5 (8 x 4 warps 78.1).
# 8-byte vectors (variant 42, which the backward takes) changed nothing here: Mamba2's one-tile
# kernel 63.0 / 63.1 us against 63.4 / 63.3; its row loop gained (78 -> 69 us) but stayed
# slower than the one-tile kernel (launch-sweep-v13-fwd-vec-*).
FORWARD_SPLIT_TILES = {128: (16, 4, 3), 256: (16, 8, 3), 1024: (1, 1, 1)}
# Long rows: (block_n, num_warps, loop_stages) of the looped forward kernel, and of the
# one-row tile of the backward's two launches over blocks of block_n columns of a group
# (variant 28). Cold, L2-cold timings at D = 16384 / 32768 (h200-2026-12-03-ab-13-long-row-
# backward.json): 1 x 2048, 4 warps, 3 stages 225.0 / 219.3 us in bf16, 220.0 / 217.2 in
# fp16, 405 / 406 in fp32; the looped kernel before it 326 / 362, 360 / 347, 463 / 496. Other
# tiles within 3 % (2 x 1024 x 4 warps: fp32 1.5 % faster, 1 x 1024: fp16 3 % faster,
# bf16 3 % slower); 2048 x 8 warps and 4096 x 16 were 5-30 % slower.
FORWARD_LONG_ROW = (4096, 16, 1)
BACKWARD_LONG_ROW = (2048, 4, 3)
# Shared memory a block may use when the device cannot be asked (H100 and H200: 227 KB), and
# what to leave beside the prefetch buffers for the kernels' reductions.
DEFAULT_SHARED_MEMORY_BYTES = 232448
SHARED_MEMORY_RESERVE = 16384
# A forward whose table entry prefetches (loop_stages > 1) runs resident programs over chunks
# of rows (forward_row_loop_kernel), about this many (chunk, group) programs in all (measured
# best of 1056-4224). The forward reduces nothing across programs, so this may be tuned freely.
FORWARD_TARGET_PROGRAMS = 4224
# Row-loop tiles measured fastest at another count, whole and partial (as the backward's
# tables below): the 8192-wide row loop (one row, 8 warps a program; groups of 4097-8192)
# runs fastest with half as many, 100.5-100.6 against 102.6-102.8 us at D = 8192, while the
# partial tiles that also loop (D = 96, 192, Mamba2's 640) were 2-3 % slower at 2112 (two
# interleaved repeats each, cold: h200-2026-12-03-launch-sweep-v7-fwd-targets.json) and keep
# the default.
FORWARD_TILE_TARGET_PROGRAMS = {8192: 2112, 16384: 528}
FORWARD_PARTIAL_TILE_TARGET_PROGRAMS = {8192: 2112, 16384: 528}
# Decode-size forwards: when the table's tile would start fewer programs than this (one per
# SM of an H100/H200), a one-warp tile of FEW_ROWS_TILE_ELEMENTS elements starts more, smaller
# programs and finishes sooner: 32 rows of 128 take 1.43 us instead of 1.82 us per forward in a
# CUDA graph, 2048 rows 1.95 instead of 2.14 us (decode-sweep-v1). Every row is reduced by the
# same lanes in the same order in either tile, so the bits do not change. 0 turns this off.
FORWARD_FEW_PROGRAMS = 132
FEW_ROWS_TILE_ELEMENTS = 256
# The backward splits rows into about this many (chunk, group) programs. A constant, not the
# SM count: the partition, and so dweight's rounding, must not depend on the GPU.
BACKWARD_TARGET_PROGRAMS = 1056
# Tiles measured fastest at another program count, whole (by width) and partial (groups that
# fill part of their power-of-two tile). Cold sweeps, two rounds each, programmatic launch on
# (h200-2026-12-03-launch-sweep-v8-bwd-targets*.json, -v9-bwd-targets*):
#   whole 512 (two rows, 2 warps): 189.2 us at 1584 against 192.9 at 1056 (189.8 at 528,
#     194.3 at 792).
#   whole 1024 (one row, 2 warps): D = 1024 134.9 us at 528 against 149.6 at 1056 (155 at
#     396); Nemotron-H's gate-first groups 175.3 against 202.2 (187 at 792, 200 at 396, 228 at
#     264), and at 4096 tokens best at 528 again (92.4 us, next 94.3).
#   whole 4096 and 8192 (one row, 8 and 16 warps, one program an SM): 264 was 3-4 % faster
#     than 1056 (fewer D-wide dweight partials to write and re-read; launch-sweep-v6); then
#     the 4096 tile 183.0 us at 132 against 187.4 at 264, 189.4 at 396, 236.5 at 198; the 8192
#     tile best at 264 (178.7 against 182.0 at 132 and 396). Partial wide tiles: unswept, 264.
#   partial 1024 (one row, 2 warps since variant 38; six programs an SM with the gate first):
#     Mamba2 123.2 us at 792 against 150.9 at 1056 and 136.6 at 528 (the two-row 4-warp tile
#     before it: 128.4 at its best, 396); at 4096 tokens 792 again (66.0 us, next 67.6).
#   partial 128 and 256 (four rows, one warp): D = 96 140.8 us at 1584 against 156.5 at 1056
#     (144 at 2112), D = 192 148.9 against 171.8 (174 at 2112); fp16 alike (138.5 / 147.5 us
#     against 149.6 / 153.9).
#   whole 32, 64 and 256 (16 x 32, 8 x 64, 2 x 256, one warp): 1040 instead of 1056
#     (variant 48, launch-sweep-v14-bwd-*-stride / -targets-*): D = 64 133.2 / 132.9 us
#     against 140.4 / 141.8 (and 175 against 178.6 at 1048576 rows), D = 32 135.8 / 136.1
#     against 141.5 / 141.1, D = 256 175.3 / 175.2 against 177.3 / 177.1. Around 1056 the
#     count is sharp in a way the placement does not explain (one warp programs go round
#     robin, eight an SM at 1056: program-placement.json): 1046-1049 programs ran 1-5 %
#     slower than 1033-1035, 1057 or more 9-11 % (a ninth program on some SMs), and exactly
#     1024 chunks of a power-of-two stride (128 KB) 7-9 %. Mamba2's split tile was 1-2 %
#     faster at 1040 (1024 programs against 1048), under the 3 % a change asks: kept.
#   whole 2048 (one row, 4 warps since variant 52): 1584, see BACKWARD_TILES. At 24576 rows
#     792 was 133.9 / 134.0 us, 1.5 % faster, but is unmeasured at other row counts; at
#     32768 rows 1584 was the four-warp tile's best, 176.3 / 176.5 us against 183.0 at 1056
#     and 178.5 / 178.2 for the two-warp tile at 1056 (launch-sweep-v10-bwd-tiles-d2048-*).
# Keeping the default: 128 (GDN: within 1 % either way at 1040, 1.2 % slower at 8192 x 32,
# where 1040 gives 1024 chunks of 64 KB; 1056 best of 528-2112; again for the variant-43
# tiles among 528-1584, and against each tile's full wave of programs, e.g. 2376 for the 128
# tile: 8-17 % slower, launch-sweep-v13-bwd-wave-*). The partial 256 count, measured on the
# four-row tile, holds for the two-row one (D = 224: 169.3 us at 1584, 168.9 at 1056).
# Narrower groups than 32 take the default (unmeasured).
BACKWARD_TILE_TARGET_PROGRAMS = {32: 1040, 64: 1040, 256: 1040, 512: 1584, 1024: 528,
                                 2048: 1584, 4096: 132, 8192: 264}
BACKWARD_PARTIAL_TILE_TARGET_PROGRAMS = {128: 1584, 256: 1584, 1024: 792, 2048: 1584,
                                         4096: 264, 8192: 264}
# Programmatic dependent launch (sm_90+, eager launches) between the backward's launches (the
# main kernel or the two launches of a cut group, then the two dweight reduction levels):
# each launch after the first is started as soon as its predecessor's programs exit and
# waits for its writes (WAIT_FOR_PRIOR_GRID) before reading them, which hides the launch gaps:
# about 3 us off every backward with a weight (GDN 8192 x 32 95.2 -> 92.3 us, 4096 x 32 53.2
# -> 50.0, D = 16384 227.0 -> 221.3; h200-2026-12-03-ab-16-backward-variants.json, two
# rounds, same bits). BACKWARD_EARLY_DEPENDENTS lets each launch start its successor from its
# own first instruction (LAUNCH_DEPENDENTS) instead: equal on the GDN shapes, 2-5 us slower
# at D = 8192 and on long rows, so off.
BACKWARD_PROGRAMMATIC_LAUNCH = True
BACKWARD_EARLY_DEPENDENTS = False
# Each chunk writes and re-reads a D-wide fp32 partial row: at 16 or more rows per chunk that
# traffic stays under 3 % of the backward's own bytes.
MIN_ROWS_PER_CHUNK = 16


# Variant 27: how the forward tile kernel's training launch stores rstd and addresses rows.
# Triton moves a 1-D store's values into a fresh layout through shared memory (two barriers,
# registers held); "by PTX" stores rstd from the reduction's own layout, before y. "Shared
# rows": tensors whose row strides equal x's (y always, the gate when not sliced) use x's
# row offsets. Each choice changes ptxas's schedule and register count, and the best one
# differs by tile, dtype, activation and gate layout, so it is measured and tabled like the
# tiles. Keys: (block_n, x dtype, activation, gate sliced / more than one leading dim).
# Figures: us, kernel as before -> chosen, two rounds each (benchmarks/results/
# h200-2026-12-02-ab-10-shared-offsets.json, ab-12):
#   128 bf16 silu:          53.0 / 103.2 / 400.9 -> 50.5 / 96.7 / 372.8 (8192x32, 8192x64,
#                           65536x32; FLA 50.8 / 97.4 / 372.3)
#   128 bf16 silu sliced:   56.6 / 415.6 -> 51.2 / 380.6 (own rows; shared: 54.1 / 403.7)
#   128 bf16 sigmoid:       80.7 -> 74.3 (4096x96);  sliced: 84.3 -> 75.4 (shared rows)
#   64 bf16 silu: 79.8 -> 78.0;  64 fp16 silu: 82.7 -> 74.5;  256 bf16 silu (tl.store after
#   y, shared rows): 75.6 -> 74.0
# Measured and left as before: 128 fp16 silu (52.0 by PTX against 50.0), 256 fp16 (73.1
# best), 128 fp32 (equal). Everything unmeasured, inference launches (no rstd: shared rows
# measured slower) and traced launches (torch.compile cannot see a store inside inline PTX)
# keep tl.store after y and each tensor's own offsets. One-row tiles (D >= 1024) measured 1-4 %
# slower by PTX and have no entry.
FORWARD_TILE_STORE = {  # -> (rstd by PTX, shared rows)
    (64, torch.bfloat16, "silu", False): (True, True),
    (128, torch.bfloat16, "silu", False): (True, True),
    (128, torch.bfloat16, "silu", True): (True, False),
    (128, torch.bfloat16, "sigmoid", False): (True, True),
    (128, torch.bfloat16, "sigmoid", True): (True, True),
    (256, torch.bfloat16, "silu", False): (False, True),
    (64, torch.float16, "silu", False): (True, True),
}
# The backward tile kernel shares row offsets on tiles of several rows with one leading dim
# (ab-10, ab-11; "own" = each tensor its own offsets, as before): bf16 Mamba2 134.5 against
# 140.5 us own, D = 256 147.9 / 156.8, D = 64 142.8 / 147.0, D = 96 158.3 / 161.0, GDN 1-2 %,
# fp32 GDN 182.0 / 185.9; fp16 equal or better. One-row tiles measured 2-7 % slower with it
# (D = 4096: ptxas spilled), and so did D = 192 on the padded 256 tile: 165.2 against 146.5
# us in bf16, 145.2 / 139.7 in fp16; both keep their own offsets. (D = 192 now takes a head +
# tail tile, which shares them: that is how variant 41 measured it.) (Same-kernel repeats in these
# files differ by up to 1 %, and once 3 %: smaller differences are not counted.)
BACKWARD_PARTIAL_OWN_ROWS = {256}


@dataclass(frozen=True)
class LaunchConfig:
    """How one kernel launch tiles the rows of one group size."""

    block_rows: int
    block_n: int
    num_warps: int
    # The group is wider than block_n: the forward loops over its columns, the backward cuts
    # it into column blocks of block_n (two launches).
    long_row: bool
    # Software-pipelining depth of the kernel's loop (rows in the backward tile kernel and
    # the forward row loop, column chunks in the forward long-row kernel); 1 = no prefetch.
    loop_stages: int = 1
    # Tiles with a measured program count of their own (forward_target_programs of a row
    # loop, backward_target_programs); None: FORWARD_ / BACKWARD_TARGET_PROGRAMS.
    target_programs: int | None = None
    # The group is held as block_n columns and a tail of tail_n more (both powers of two)
    # instead of one tile padded to the next power of two (head_and_tail); 0: no tail.
    tail_n: int = 0
    # Loads and stores at most this many elements wide (the kernels' ROW_ALIGN hint is capped
    # to it); 0: as wide as the rows' alignment allows (16 bytes). A narrower vector can give
    # a head and its tail one register layout, so that Triton adds their per-row sums as they
    # are instead of computing the head again in the tail's layout (variant 42).
    max_vector_elements: int = 0


def head_and_tail(group_size: int) -> tuple[int, int] | None:
    """(head, tail) widths, powers of two, of a group held as two tiles side by side: half
    its padded width, then the rest rounded up. None where that is no narrower than the
    padded tile by a quarter or more (the rest is over a quarter of the padded width), and
    for powers of two."""
    block_n = triton.next_power_of_2(group_size)
    head = block_n // 2
    if group_size == block_n or group_size - head > head // 2:
        return None
    return head, triton.next_power_of_2(group_size - head)


def _tile_config(group_size: int, tiles: dict, partial_tiles: dict,
                 long_row: tuple[int, int, int], targets: dict | None = None,
                 partial_targets: dict | None = None,
                 split_tiles: dict | None = None) -> LaunchConfig:
    block_n = triton.next_power_of_2(group_size)
    if block_n > max(tiles):
        return LaunchConfig(1, long_row[0], long_row[1], True, long_row[2])
    if block_n < min(tiles):
        # Narrow groups: as many rows as the narrowest measured tile holds elements.
        rows, warps, stages = tiles[min(tiles)]
        return LaunchConfig(rows * min(tiles) // block_n, block_n, warps, False, stages,
                            (targets or {}).get(block_n))
    partial = group_size != block_n
    split = head_and_tail(group_size) if block_n in (split_tiles or {}) else None
    if split is not None:
        # (rows, warps, stages[, programs[, largest vector]]): a program count of its own
        # (None: the partial tile's), loads capped at that many elements.
        rows, warps, stages, *extra = split_tiles[block_n]
        target = extra[0] if extra else None
        if target is None:
            target = (partial_targets or {}).get(block_n)
        return LaunchConfig(rows, split[0], warps, False, stages, target, tail_n=split[1],
                            max_vector_elements=extra[1] if len(extra) > 1 else 0)
    if partial and block_n in partial_tiles:
        rows, warps, stages = partial_tiles[block_n]
    else:
        rows, warps, stages = tiles[block_n]
    target = ((partial_targets if partial else targets) or {}).get(block_n)
    return LaunchConfig(rows, block_n, warps, False, stages, target)


def forward_config(group_size: int) -> LaunchConfig:
    """Forward tile for one group size (the same element count for every dtype)."""
    return _tile_config(group_size, FORWARD_TILES, FORWARD_PARTIAL_TILES, FORWARD_LONG_ROW,
                        FORWARD_TILE_TARGET_PROGRAMS, FORWARD_PARTIAL_TILE_TARGET_PROGRAMS,
                        FORWARD_SPLIT_TILES)


def few_rows_forward_config(config: LaunchConfig, rows: int, num_groups: int) -> LaunchConfig:
    """``config``, or the one-warp decode tile when ``config`` would start fewer than
    FORWARD_FEW_PROGRAMS programs over ``rows`` x ``num_groups`` (tiles up to 128 wide, where
    it was measured; not a group held as head + tail, whose reduction order depends on the
    tile's rows and warps, so another tile could change y's bits). ``rows`` must be a
    concrete int: under torch.compile with a symbolic row count the caller keeps the table's
    tile instead of guarding on the count."""
    if (config.long_row or config.block_n > 128 or config.tail_n
            or triton.cdiv(rows, config.block_rows) * num_groups >= FORWARD_FEW_PROGRAMS):
        return config
    return LaunchConfig(max(1, FEW_ROWS_TILE_ELEMENTS // config.block_n), config.block_n, 1,
                        False, 1)


def backward_config(group_size: int) -> LaunchConfig:
    """Backward tile for one group size."""
    return _tile_config(group_size, BACKWARD_TILES, BACKWARD_PARTIAL_TILES, BACKWARD_LONG_ROW,
                        BACKWARD_TILE_TARGET_PROGRAMS, BACKWARD_PARTIAL_TILE_TARGET_PROGRAMS,
                        BACKWARD_SPLIT_TILES)


def fit_shared_memory(config: LaunchConfig, loaded_bytes_per_element: int,
                      shared_memory_bytes: int) -> LaunchConfig:
    """``config``, or the same without prefetching (loop_stages 1) when its prefetch buffers
    would not fit the device's shared memory: (loop_stages - 1) tiles of everything the loop
    loads (``loaded_bytes_per_element`` summed over those tensors). The table was tuned on
    16-bit inputs; fp32 inputs double the buffers, and a kernel over the limit would fail to
    launch. Prefetching changes no result."""
    prefetch_bytes = ((config.loop_stages - 1) * config.block_rows
                      * (config.block_n + config.tail_n)
                      * loaded_bytes_per_element)
    if config.loop_stages > 1 and prefetch_bytes + SHARED_MEMORY_RESERVE > shared_memory_bytes:
        return replace(config, loop_stages=1)
    return config


def forward_target_programs(config: LaunchConfig) -> int:
    """About how many (chunk, group) programs the forward row loop of ``config`` starts."""
    if config.target_programs is not None:
        return config.target_programs
    return FORWARD_TARGET_PROGRAMS


def forward_chunking(rows: int, num_groups: int, block_rows: int,
                     target_programs: int | None = None) -> tuple[int, int]:
    """(rows_per_chunk, num_chunks) of the forward's row loop: a multiple of block_rows, for
    about ``target_programs`` programs (forward_target_programs of the tile; by default
    FORWARD_TARGET_PROGRAMS). Tiles start at the same rows whatever the chunking, so the
    bits do not depend on it."""
    target_programs = target_programs or FORWARD_TARGET_PROGRAMS
    chunks_wanted = max(1, target_programs // num_groups)
    rows_per_chunk = torch.sym_max(triton.cdiv(rows, chunks_wanted), block_rows)
    rows_per_chunk = triton.cdiv(rows_per_chunk, block_rows) * block_rows
    return rows_per_chunk, triton.cdiv(rows, rows_per_chunk)


def backward_target_programs(config: LaunchConfig) -> int:
    """About how many (chunk, group) programs the backward of ``config`` starts."""
    if config.target_programs is not None:
        return config.target_programs
    return BACKWARD_TARGET_PROGRAMS


def backward_chunking(rows: int, num_groups: int, block_rows: int,
                      target_programs: int | None = None) -> tuple[int, int]:
    """(rows_per_chunk, num_chunks): a multiple of block_rows, fixed by the shape and the
    tile alone (``target_programs``: backward_target_programs of the tile, by default
    BACKWARD_TARGET_PROGRAMS)."""
    target_programs = target_programs or BACKWARD_TARGET_PROGRAMS
    chunks_wanted = max(1, target_programs // num_groups)
    # sym_max keeps a symbolic row count symbolic under torch.compile (max() would guard).
    rows_per_chunk = torch.sym_max(triton.cdiv(rows, chunks_wanted), MIN_ROWS_PER_CHUNK)
    rows_per_chunk = triton.cdiv(rows_per_chunk, block_rows) * block_rows
    return rows_per_chunk, triton.cdiv(rows, rows_per_chunk)


def shares_row_offsets(config: LaunchConfig, leading_dims: int, group_size: int) -> bool:
    """Whether the backward addresses tensors whose row strides equal x's with x's offsets."""
    partial = group_size != config.block_n
    return (not config.long_row and config.block_rows > 1 and leading_dims == 1
            and not (partial and config.block_n in BACKWARD_PARTIAL_OWN_ROWS))


def forward_tile_store(config: LaunchConfig, x_dtype: torch.dtype, activation: str,
                       leading_dims: int, store_rstd: bool,
                       traceable: bool) -> tuple[bool, bool]:
    """(rstd by PTX, shared rows) of a forward tile kernel launch (FORWARD_TILE_STORE)."""
    if not store_rstd or traceable or config.tail_n:
        return False, False
    return FORWARD_TILE_STORE.get((config.block_n, x_dtype, activation, leading_dims > 1),
                                  (False, False))
