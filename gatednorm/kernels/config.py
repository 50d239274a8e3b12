"""The launch table: one measured entry per (pass, tile width, kind), no autotuning.

Autotuning on the hot path is slow on the first call and can pick differently from run to run,
which would also change dweight's bits (the chunking depends on the tile). Every number here was
measured on an H200 with 16-bit inputs (cold timings, two rounds, adopted only when faster by
3 % or more in both); docs/perf-notes.md describes how. gatednorm.kernels.plan turns an entry
into a finished launch plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

FORWARD, BACKWARD = "forward", "backward"
# Kinds of entry. WHOLE: the group is its power-of-two tile width. PARTIAL: the group fills
# part of it (padded columns are masked). HEAD_TAIL: the group is held as two power-of-two
# tiles side by side (head_and_tail), keyed by the padded width. LONG_ROW: groups wider than
# the widest WHOLE entry (the forward loops over columns, the backward cuts them into blocks).
WHOLE, PARTIAL, HEAD_TAIL, LONG_ROW = "whole", "partial", "head_tail", "long_row"


@dataclass(frozen=True)
class TileEntry:
    """One measured launch: ``rows`` x ``width`` tiles on ``warps`` warps.

    stages: software-pipelining depth of the kernel's loop (1: no prefetch; a forward entry
    with more runs the row-loop kernel). programs: about how many (chunk, group) programs the
    pass starts, where measured for this entry (None: FORWARD_ / BACKWARD_TARGET_PROGRAMS).
    max_vector_elements: loads capped at this many elements (0: the rows' alignment decides).
    shares_rows: a backward tile of several rows addresses tensors laid out like x with x's
    row offsets."""

    pass_: str
    width: int
    kind: str
    rows: int
    warps: int
    stages: int = 1
    programs: int | None = None
    max_vector_elements: int = 0
    shares_rows: bool = True


def _whole_and_partial(pass_: str, width: int, **fields) -> tuple[TileEntry, TileEntry]:
    return (TileEntry(pass_, width, WHOLE, **fields), TileEntry(pass_, width, PARTIAL, **fields))


TABLE: dict[tuple[str, int, str], TileEntry] = {
    (entry.pass_, entry.width, entry.kind): entry for entry in (
        # --- forward ----------------------------------------------------------------------
        # 16 rows on 2 warps beat 32 rows on 4 at D = 64 (74.1 against 78.1 us); narrower
        # groups take as many rows as it holds elements.
        *_whole_and_partial(FORWARD, 64, rows=16, warps=2),
        TileEntry(FORWARD, 128, WHOLE, rows=16, warps=4),
        # Partial tiles move fewer bytes per instruction: the row loop's prefetch won 3-11
        # points of bandwidth there (D = 96, 192, 640), the one-tile kernel on full tiles.
        TileEntry(FORWARD, 128, PARTIAL, rows=16, warps=4, stages=3),
        TileEntry(FORWARD, 128, HEAD_TAIL, rows=16, warps=4, stages=3),  # D = 96: 78.3 vs 81.3 us
        TileEntry(FORWARD, 256, WHOLE, rows=4, warps=2),
        TileEntry(FORWARD, 256, PARTIAL, rows=8, warps=4, stages=3),
        TileEntry(FORWARD, 256, HEAD_TAIL, rows=16, warps=8, stages=3),  # D = 192: 76.7 vs 80.5 us
        *_whole_and_partial(FORWARD, 512, rows=4, warps=4),
        # One warp a row: 74.6 against 78.4 us for two at D = 1024.
        TileEntry(FORWARD, 1024, WHOLE, rows=1, warps=1),
        TileEntry(FORWARD, 1024, PARTIAL, rows=2, warps=2, stages=3),
        # Mamba2's 640 = 512 + 128: the one-tile kernel 63.7 us against 74.4 for the padded
        # row loop (a prefetching head + tail loop recomputes the head in the tail's layout).
        TileEntry(FORWARD, 1024, HEAD_TAIL, rows=1, warps=1),
        *_whole_and_partial(FORWARD, 2048, rows=1, warps=2),
        *_whole_and_partial(FORWARD, 4096, rows=1, warps=4),
        # Groups up to 16384 stay in registers; the row loop at 2112 / 528 programs ran 2 %
        # faster than at the default count.
        *_whole_and_partial(FORWARD, 8192, rows=1, warps=8, stages=3, programs=2112),
        *_whole_and_partial(FORWARD, 16384, rows=1, warps=16, stages=3, programs=528),
        # Longer groups: two passes over 4096-column chunks (5-30 % faster than other chunks).
        TileEntry(FORWARD, 4096, LONG_ROW, rows=1, warps=16),
        # --- backward ---------------------------------------------------------------------
        # One-warp tiles of 512 elements; 1040 programs beat 1056 by 4-6 % at D = 32 and 64
        # (a ninth one-warp program on some SMs around 1056). Narrower groups: default count.
        *_whole_and_partial(BACKWARD, 32, rows=16, warps=1, stages=3, programs=1040),
        *_whole_and_partial(BACKWARD, 64, rows=8, warps=1, stages=3, programs=1040),
        # GDN: 4 x 128 on one warp, the default count (best of 528-2112).
        TileEntry(BACKWARD, 128, WHOLE, rows=4, warps=1, stages=3),
        TileEntry(BACKWARD, 128, PARTIAL, rows=4, warps=1, stages=3, programs=1584),  # D = 96
        # Two rows beat four (177.4 against 184.0 us at D = 256).
        TileEntry(BACKWARD, 256, WHOLE, rows=2, warps=1, stages=3, programs=1040),
        # The padded tile with shared row offsets ran 13 % slower at D = 224.
        TileEntry(BACKWARD, 256, PARTIAL, rows=2, warps=1, stages=3, programs=1584,
                  shares_rows=False),
        TileEntry(BACKWARD, 256, HEAD_TAIL, rows=4, warps=1, stages=3, programs=2112),  # D = 192
        TileEntry(BACKWARD, 512, WHOLE, rows=2, warps=2, stages=4, programs=1584),
        TileEntry(BACKWARD, 512, PARTIAL, rows=2, warps=2, stages=4),
        # One row, 2 warps: 528 programs 10 % faster at D = 1024, 792 for partial groups.
        TileEntry(BACKWARD, 1024, WHOLE, rows=1, warps=2, stages=3, programs=528),
        TileEntry(BACKWARD, 1024, PARTIAL, rows=1, warps=2, stages=3, programs=792),
        # Mamba2 (640 = 512 + 128): 8-byte vectors give head and tail one register layout;
        # eight one-warp programs an SM, so 1056 is one wave (118 against 123 us padded).
        TileEntry(BACKWARD, 1024, HEAD_TAIL, rows=1, warps=1, stages=3, programs=1056,
                  max_vector_elements=4),
        # Four warps: two spill 46 registers gate first (143 against 182 us at D = 2048).
        *_whole_and_partial(BACKWARD, 2048, rows=1, warps=4, stages=3, programs=1584),
        # One program an SM: fewer D-wide dweight partials to write and re-read.
        TileEntry(BACKWARD, 4096, WHOLE, rows=1, warps=8, stages=4, programs=132),
        TileEntry(BACKWARD, 4096, PARTIAL, rows=1, warps=8, stages=4, programs=264),
        *_whole_and_partial(BACKWARD, 8192, rows=1, warps=16, stages=3, programs=264),
        # Longer groups: two launches over 2048-column blocks (225 against 326 us for the
        # looped kernel at D = 16384).
        TileEntry(BACKWARD, 2048, LONG_ROW, rows=1, warps=4, stages=3),
    )
}

# Programs of a pass whose entry has no count of its own. The backward's is a constant, not the
# SM count: the row partition, and so dweight's rounding, must not depend on the GPU.
FORWARD_TARGET_PROGRAMS = 4224
BACKWARD_TARGET_PROGRAMS = 1056
# Each backward chunk writes and re-reads a D-wide fp32 dweight partial: 16 or more rows per
# chunk keep that under 3 % of the pass's bytes.
MIN_ROWS_PER_CHUNK = 16
# Decode-size forwards: a table tile (up to 128 wide) that would start fewer programs than this
# (one per SM) gives way to a one-warp tile of FEW_ROWS_TILE_ELEMENTS elements: 1.43 against
# 1.82 us for 32 rows of 128 in a CUDA graph; same lanes, same order, same bits. 0: off.
FORWARD_FEW_PROGRAMS = 132
FEW_ROWS_TILE_ELEMENTS = 256
# Programmatic dependent launch between the backward's launches (sm_90+, eager): each launch
# after the first starts as its predecessor's programs exit (about 3 us off a backward).
BACKWARD_PROGRAMMATIC_LAUNCH = True
# Shared memory a block may use when the device cannot be asked (H100 and H200: 227 KB), and
# what to leave beside the prefetch buffers for the kernels' reductions.
DEFAULT_SHARED_MEMORY_BYTES = 232448
SHARED_MEMORY_RESERVE = 16384


@dataclass(frozen=True)
class StoreChoice:
    """How the forward tile kernel's training launch stores rstd and addresses rows: rstd by
    inline PTX from the reduction's layout, before y (no shared-memory round trip), and the
    gate and y with x's row offsets where their row strides equal x's."""

    rstd_by_ptx: bool
    shared_rows: bool


# Keyed by (tile width, x dtype, activation, gate sliced or more than one leading dim); measured
# per key because each choice moves ptxas's schedule (GDN 128 bf16 silu: 53.0 -> 50.5 us).
# Everything else, inference and traced launches keep tl.store after y and own offsets.
FORWARD_TILE_STORE = {
    (64, torch.bfloat16, "silu", False): StoreChoice(True, True),
    (128, torch.bfloat16, "silu", False): StoreChoice(True, True),
    (128, torch.bfloat16, "silu", True): StoreChoice(True, False),
    (128, torch.bfloat16, "sigmoid", False): StoreChoice(True, True),
    (128, torch.bfloat16, "sigmoid", True): StoreChoice(True, True),
    (256, torch.bfloat16, "silu", False): StoreChoice(False, True),
    (64, torch.float16, "silu", False): StoreChoice(True, True),
}
NO_STORE_CHOICE = StoreChoice(False, False)


@dataclass(frozen=True)
class LaunchConfig:
    """The tile one pass runs for one group size (a table entry applied to that size)."""

    block_rows: int
    block_n: int
    num_warps: int
    # The group is wider than block_n: the forward loops over its columns, the backward cuts
    # it into column blocks of block_n (two launches).
    long_row: bool
    loop_stages: int = 1
    target_programs: int | None = None
    # The group is held as block_n columns and a tail of tail_n more; 0: no tail.
    tail_n: int = 0
    max_vector_elements: int = 0
    shares_rows: bool = True


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


def whole_widths(pass_: str) -> list[int]:
    """The widths of ``pass_``'s WHOLE entries, narrowest first."""
    return sorted(w for (p, w, kind) in TABLE if p == pass_ and kind == WHOLE)


def table_entry(pass_: str, group_size: int) -> tuple[TileEntry, int]:
    """(entry, block_n) of ``group_size`` in ``pass_``: the entry of its padded width and kind;
    below the narrowest WHOLE width, that entry (its rows scaled by how many times narrower
    the tile is, the default program count); above the widest, the LONG_ROW entry."""
    width = triton.next_power_of_2(group_size)
    whole = whole_widths(pass_)
    if width > whole[-1]:
        (entry,) = (e for e in TABLE.values() if e.pass_ == pass_ and e.kind == LONG_ROW)
        return entry, entry.width
    if width < whole[0]:
        entry = TABLE[(pass_, whole[0], WHOLE)]
        return TileEntry(pass_, width, WHOLE, rows=entry.rows * whole[0] // width,
                         warps=entry.warps, stages=entry.stages), width
    if group_size == width:
        return TABLE[(pass_, width, WHOLE)], width
    if (pass_, width, HEAD_TAIL) in TABLE and head_and_tail(group_size) is not None:
        return TABLE[(pass_, width, HEAD_TAIL)], width
    return TABLE[(pass_, width, PARTIAL)], width


def tile_config(pass_: str, group_size: int) -> LaunchConfig:
    """The table's tile for one group size (the same element count for every dtype)."""
    entry, width = table_entry(pass_, group_size)
    block_n, tail_n = width, 0
    if entry.kind == HEAD_TAIL:
        block_n, tail_n = head_and_tail(group_size)
    return LaunchConfig(block_rows=entry.rows, block_n=block_n, num_warps=entry.warps,
                        long_row=entry.kind == LONG_ROW, loop_stages=entry.stages,
                        target_programs=entry.programs, tail_n=tail_n,
                        max_vector_elements=entry.max_vector_elements,
                        shares_rows=entry.shares_rows)


def forward_config(group_size: int) -> LaunchConfig:
    """Forward tile for one group size."""
    return tile_config(FORWARD, group_size)


def backward_config(group_size: int) -> LaunchConfig:
    """Backward tile for one group size."""
    return tile_config(BACKWARD, group_size)


def chunking(rows, num_groups: int, block_rows: int, target_programs: int,
             min_rows_per_chunk: int = 1) -> tuple:
    """(rows_per_chunk, num_chunks): a multiple of block_rows (at least
    ``min_rows_per_chunk``), for about ``target_programs`` (chunk, group) programs. Fixed by
    the shape and the tile alone, never by the GPU."""
    chunks_wanted = max(1, target_programs // num_groups)
    # sym_max keeps a symbolic row count symbolic under torch.compile (max() would guard).
    rows_per_chunk = torch.sym_max(triton.cdiv(rows, chunks_wanted),
                                   max(block_rows, min_rows_per_chunk))
    rows_per_chunk = triton.cdiv(rows_per_chunk, block_rows) * block_rows
    return rows_per_chunk, triton.cdiv(rows, rows_per_chunk)


def backward_chunking(rows, num_groups: int, block_rows: int,
                      target_programs: int | None = None) -> tuple:
    """The backward's (rows_per_chunk, num_chunks), at least MIN_ROWS_PER_CHUNK rows a chunk
    (``target_programs`` by default BACKWARD_TARGET_PROGRAMS)."""
    return chunking(rows, num_groups, block_rows,
                    target_programs or BACKWARD_TARGET_PROGRAMS, MIN_ROWS_PER_CHUNK)
