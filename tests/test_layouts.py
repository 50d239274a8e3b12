"""Strided and permuted inputs, odd sizes, long rows, row counts and row partitions.

A layout must not change a single bit: every strided case is compared with the same call on
contiguous copies (forward and all gradients, bitwise), and the contiguous result is itself
checked against fp64 by the accuracy tests or here.
"""

import dataclasses

import pytest
import torch
import triton

import gatednorm
from gatednorm.kernels import config, launch, layout
from gatednorm.kernels import plan as planner

from conftest import (
    assert_finite,
    assert_matches_composite,
    assert_three_way,
    composite,
    fp64_truth,
    fused,
    fused_on_views,
    make_inputs,
    rows_of,
)

pytestmark = pytest.mark.usefixtures("interpreter")


def _assert_same_as_contiguous(x, gate, weight, dy, **options):
    laid_out = fused_on_views(x, gate, weight, dy, **options)
    y, dx, dgate, dweight = laid_out.y, laid_out.dx, laid_out.dgate, laid_out.dweight
    plain = fused(x.detach().contiguous(), gate.detach().contiguous(),
                  None if weight is None else weight.detach().contiguous(), dy.contiguous(),
                  **options)
    assert y.is_contiguous() and y.shape == x.shape
    assert torch.equal(y, plain.y), "y depends on the layout"
    assert torch.equal(dx, plain.dx), "dx depends on the layout"
    assert torch.equal(dgate, plain.dgate), "dgate depends on the layout"
    if weight is not None:
        assert torch.equal(dweight, plain.dweight), "dweight depends on the layout"
    assert_finite(plain)
    return plain


def _projection(t, heads, d, dtype, parts=3):
    return torch.randn(t, parts * heads * d).to(dtype)


OPTIONS = [
    pytest.param(dict(rounding="te"), id="te-norm_first"),
    pytest.param(dict(rounding="hf", norm_before_gate=False, group_size=16),
                 id="hf-gate_first-group16"),
    pytest.param(dict(rounding="fp32", activation="sigmoid", zero_centered_gamma=True),
                 id="fp32-sigmoid-zero_centered"),
]


@pytest.mark.parametrize("options", OPTIONS)
def test_gate_sliced_from_projection_output(options):
    t, h, d = 37, 4, 32
    proj = _projection(t, h, d, torch.bfloat16)
    x = torch.randn(t, h, d).to(torch.bfloat16)
    gate = proj[:, h * d:2 * h * d].view(t, h, d)
    weight = (0.2 * torch.randn(d)).to(torch.bfloat16)
    dy = torch.randn(t, h, d).to(torch.bfloat16)
    assert layout.row_layout([x, gate, x], d) is not None  # read in place, no copy
    _assert_same_as_contiguous(x, gate, weight, dy, **options)


@pytest.mark.parametrize("heads, d", [(3, 128), (5, 64), (7, 256), (2, 1024), (3, 640)],
                         ids=lambda v: str(v))
def test_sliced_gate_whose_row_tiles_cross_token_boundaries(heads, d):
    # The backward steps its row offsets tile by tile; with a head count that the tile height
    # does not divide, a tile's rows cross from one token (one projection row) into the next
    # at a different place in every tile and every chunk.
    t = 41
    proj = _projection(t, heads, d, torch.bfloat16)
    x = torch.randn(t, heads, d).to(torch.bfloat16)
    gate = proj[:, heads * d:2 * heads * d].view(t, heads, d)
    weight = (0.2 * torch.randn(d)).to(torch.bfloat16)
    dy = torch.randn(t, heads, d).to(torch.bfloat16)
    assert layout.row_layout([x, gate, x], d).leading_dims == 2
    assert config.backward_config(d).block_rows % heads != 0 or heads == 1
    _assert_same_as_contiguous(x, gate, weight, dy, rounding="te")


def test_gradient_flows_into_the_projection_slices():
    t, h, d = 20, 2, 64
    proj = _projection(t, h, d, torch.float16).requires_grad_()
    x = proj[:, :h * d].view(t, h, d)
    gate = proj[:, h * d:2 * h * d].view(t, h, d)
    dy = torch.randn(t, h, d).half()
    gatednorm.rms_norm_gated(x, gate).backward(dy)
    plain = fused(x.detach().contiguous(), gate.detach().contiguous(), None, dy)
    assert torch.equal(proj.grad[:, :h * d], plain.dx.reshape(t, h * d))
    assert torch.equal(proj.grad[:, h * d:2 * h * d], plain.dgate.reshape(t, h * d))
    assert (proj.grad[:, 2 * h * d:] == 0).all()


@pytest.mark.parametrize("options", OPTIONS)
def test_permuted_bshd_views(options):
    b, s, h, d = 2, 9, 3, 32
    x = torch.randn(b, h, s, d).half().transpose(1, 2)
    gate = torch.randn(b, h, s, d).half().transpose(1, 2)
    weight = (0.2 * torch.randn(d)).half()
    dy = torch.randn(b, s, h, d).half()
    found = layout.row_layout([x, gate, x], d)
    assert found is not None and found.leading_dims == 3
    _assert_same_as_contiguous(x, gate, weight, dy, **options)


@pytest.mark.parametrize("options", OPTIONS)
def test_x_and_gate_in_different_layouts(options):
    b, s, h, d = 2, 7, 4, 32
    x = torch.randn(b, h, s, d).to(torch.bfloat16).transpose(1, 2)
    proj = _projection(b * s, h, d, torch.bfloat16).view(b, s, 3 * h * d)
    gate = proj[..., 2 * h * d:].view(b, s, h, d)
    weight = (0.2 * torch.randn(d)).to(torch.bfloat16)
    dy = torch.randn(s, b, h, d).to(torch.bfloat16).transpose(0, 1)
    _assert_same_as_contiguous(x, gate, weight, dy, **options)


@pytest.mark.parametrize("row_width, group_size, expected", [
    (128, 128, 8), (1280, 640, 8), (100, 100, 4), (1284, 640, 4), (90, 90, 2), (128, 6, 2),
    (129, 129, 1), (128, 3, 1),
], ids=lambda v: str(v))
def test_row_align_is_the_largest_vector_every_row_start_allows(row_width, group_size,
                                                                 expected):
    """Rows and groups that start at multiples of 8, 4 or 2 elements get that ROW_ALIGN hint
    (16-, 8-, 4-byte vectors of 16-bit data), whatever the other tensors' strides allow."""
    x = torch.zeros(5, 128 * 11)[:, :row_width]
    gate = torch.zeros(5, 2, 128 * 11)[:, 1, :row_width]
    described = layout.row_layout([x, gate, x.contiguous()], group_size)
    assert described.row_align == expected


@pytest.mark.parametrize("pad", [4, 2], ids=["rows_aligned_4", "rows_aligned_2"])
@pytest.mark.parametrize("d, group_size, norm_before_gate", [
    (128, None, True), (1280, 640, False), (192, None, True)], ids=["d128", "groups640", "d192"])
def test_rows_aligned_under_16_bytes_are_read_in_place(pad, d, group_size, norm_before_gate):
    """x and gate inside buffers ``pad`` elements wider than a row: the kernels read them in
    place with a narrower ROW_ALIGN, bit for bit as contiguous copies."""
    x, gate, weight, dy = make_inputs((37, d), torch.bfloat16)
    wide = torch.zeros(2, 37, d + pad, dtype=torch.bfloat16)
    wide[0, :, :d], wide[1, :, :d] = x, gate
    x_view, gate_view = wide[0, :, :d], wide[1, :, :d]
    assert layout.row_layout([x_view, gate_view], group_size or d).row_align == pad
    plain = _assert_same_as_contiguous(x_view, gate_view, weight, dy, group_size=group_size,
                                       norm_before_gate=norm_before_gate)
    assert_three_way(plain, composite(x, gate, weight, dy, group_size=group_size,
                                      norm_before_gate=norm_before_gate),
                     fp64_truth(x, gate, weight, dy, group_size=group_size,
                                norm_before_gate=norm_before_gate), 37)


def test_non_unit_last_dim_stride_is_copied_and_right():
    t, d = 23, 48
    x = torch.randn(t, d, 2).half()[..., 0]
    gate = torch.randn(t, 2 * d).half()[:, 1::2]
    weight = (1 + 0.2 * torch.randn(2 * d)).half()[::2]
    dy = torch.randn(t, d).half()
    assert x.stride(-1) == 2 and gate.stride(-1) == 2 and weight.stride(-1) == 2
    _assert_same_as_contiguous(x, gate, weight, dy, rounding="te")


def test_more_than_three_unmergeable_leading_dims_are_copied_and_right():
    d = 16
    x = torch.randn(3, 2, 5, 4, d).to(torch.bfloat16).permute(1, 0, 3, 2, 4)
    gate = torch.randn(2, 3, 5, 4, d).to(torch.bfloat16).permute(0, 1, 3, 2, 4)
    dy = torch.randn(2, 3, 4, 5, d).to(torch.bfloat16)
    weight = (1 + 0.2 * torch.randn(d)).to(torch.bfloat16)
    assert layout.row_layout([x, gate, x], d) is None  # four leading dims stay apart
    _assert_same_as_contiguous(x, gate, weight, dy, rounding="hf", norm_before_gate=False)


def test_stride_zero_leading_dim_reads_the_same_row():
    t, d = 12, 64
    x = torch.randn(1, d).half().expand(t, d)
    gate = torch.randn(t, d).half()
    dy = torch.randn(t, d).half()
    weight = (1 + 0.2 * torch.randn(d)).half()
    _assert_same_as_contiguous(x, gate, weight, dy, rounding="fp32")


def test_leading_dims_of_size_one_anywhere():
    d = 32
    x = torch.randn(1, 6, 1, 5, 1, d).half()
    gate = torch.randn(5, 6, d).half().transpose(0, 1)[None, :, None, :, None, :]
    assert gate.shape == x.shape
    dy = torch.randn(1, 6, 1, 5, 1, d).half()
    _assert_same_as_contiguous(x, gate, None, dy, rounding="te")


# ---------------------------------------------------------------------------------------------
# Sizes.

ODD_D = [1, 3, 80, 96, 1000, 5120]


def _check_against_truth(shape, dtype, **options):
    x, gate, weight, dy = make_inputs(shape, dtype,
                                      zero_centered_gamma=options.get("zero_centered_gamma", False))
    kernel = fused(x, gate, weight, dy, **options)
    eager = composite(x, gate, weight, dy, **options)
    assert_finite(kernel)
    assert_three_way(kernel, eager, fp64_truth(x, gate, weight, dy, **options), rows_of(shape))
    assert_matches_composite(kernel, eager, dtype)
    return kernel


def _eps_for(d):
    # A one-element group's input gradient is rstd * g * (1 - xhat^2) = rstd * g * eps / (x^2 +
    # eps): with eps << x^2 it is the cancellation of two nearly equal fp32 terms, rounding noise
    # in the kernel and the composite alike. eps = 1 keeps that gradient well conditioned, so the
    # test is about the kernel's D = 1 code path and not about fp32 cancellation.
    return 1.0 if d == 1 else 1e-6


@pytest.mark.parametrize("d", ODD_D, ids=lambda d: f"D{d}")
@pytest.mark.parametrize("rounding", ["te", "fp32", "hf"])
@pytest.mark.parametrize("norm_before_gate", [True, False], ids=["norm_first", "gate_first"])
def test_odd_hidden_sizes_fp16(d, rounding, norm_before_gate):
    rows = 3 if d >= 5120 else 7
    _check_against_truth((rows, d), torch.float16, rounding=rounding, eps=_eps_for(d),
                         norm_before_gate=norm_before_gate)


@pytest.mark.parametrize("d", ODD_D, ids=lambda d: f"D{d}")
@pytest.mark.parametrize("norm_before_gate", [True, False], ids=["norm_first", "gate_first"])
def test_odd_hidden_sizes_bf16(d, norm_before_gate):
    rows = 3 if d >= 5120 else 7
    _check_against_truth((rows, d), torch.bfloat16, rounding="te", eps=_eps_for(d),
                         norm_before_gate=norm_before_gate, activation="sigmoid")


@pytest.mark.parametrize("d, group_size", [(96, 3), (80, 40), (200, 8), (1000, 125)],
                         ids=lambda v: str(v))
@pytest.mark.parametrize("norm_before_gate", [True, False], ids=["norm_first", "gate_first"])
def test_odd_group_sizes(d, group_size, norm_before_gate):
    _check_against_truth((9, d), torch.float16, group_size=group_size, rounding="hf",
                         norm_before_gate=norm_before_gate)


# The forward holds groups of up to 16384 elements in one tile, the backward up to 8192; longer
# groups take the "long row" kernels: the forward loops over a row's columns, the backward
# cuts the group into column blocks over two launches. Interpreted, each case costs seconds
# (per block of columns, whatever the block's width): the fast set keeps one case of every
# kernel pairing, order and convention, the slow set the rest.
slow = pytest.mark.slow
LONG_ROWS = [
    pytest.param((2, 20000), None, torch.bfloat16, True, "te", id="D20000-bf16-norm_first-te"),
    pytest.param((2, 20000), None, torch.float16, False, "te", id="D20000-fp16-gate_first-te"),
    pytest.param((2, 20000), None, torch.float16, True, "hf", id="D20000-fp16-norm_first-hf",
                 marks=slow),
    pytest.param((2, 20000), None, torch.bfloat16, False, "fp32",
                 id="D20000-bf16-gate_first-fp32"),
    pytest.param((1, 40000), 20000, torch.float16, True, "te",
                 id="D40000-group20000-fp16-norm_first-te", marks=slow),
    pytest.param((1, 40000), 20000, torch.bfloat16, False, "hf",
                 id="D40000-group20000-bf16-gate_first-hf", marks=slow),
    pytest.param((2, 16385), None, torch.float16, True, "te", id="D16385-first_long_forward"),
    pytest.param((2, 16384), None, torch.float16, False, "te", id="D16384-last_tile_forward"),
    pytest.param((2, 10000), None, torch.bfloat16, True, "hf", id="D10000-long_backward_only"),
]


def _long_row_pairings(cases) -> set:
    widths = [case.values[1] or case.values[0][-1] for case in cases]
    return {(config.forward_config(w).long_row, config.backward_config(w).long_row)
            for w in widths}


def test_long_row_cases_cover_every_kernel_pairing():
    assert _long_row_pairings(LONG_ROWS) == {(True, True), (False, True)}
    fast = [case for case in LONG_ROWS if not case.marks]
    assert _long_row_pairings(fast) == {(True, True), (False, True)}
    assert {case.values[3] for case in fast} == {True, False}
    assert {case.values[4] for case in fast} == {"te", "hf", "fp32"}


@pytest.mark.parametrize("shape, group_size, dtype, norm_before_gate, rounding", LONG_ROWS)
def test_long_rows(shape, group_size, dtype, norm_before_gate, rounding):
    _check_against_truth(shape, dtype, group_size=group_size, rounding=rounding,
                         norm_before_gate=norm_before_gate)


def _record_backward_chunking(monkeypatch) -> list:
    """The (rows, column_blocks, block_rows, ...) arguments and the (rows_per_chunk,
    num_chunks) result of every backward partition the launcher computes."""
    calls = []
    real = planner.backward_chunking

    def spy(*args):
        result = real(*args)
        calls.append((args, result))
        return result

    monkeypatch.setattr(planner, "backward_chunking", spy)
    return calls


def _assert_any_column_block_width(monkeypatch, shape, group_size, block_n, norm_before_gate):
    # The block width changes only the order of the row's dot product and of dweight's sums:
    # dgate after the norm does not depend on either and keeps its bits.
    torch.manual_seed(0)
    default = _check_against_truth(shape, torch.float16, group_size=group_size,
                                   norm_before_gate=norm_before_gate, rounding="te")
    long_row = config.table_entry(config.BACKWARD, group_size)[0]
    assert long_row.kind == config.LONG_ROW
    table = {key: entry for key, entry in config.TABLE.items() if entry is not long_row}
    table[(config.BACKWARD, block_n, config.LONG_ROW)] = dataclasses.replace(long_row,
                                                                             width=block_n)
    monkeypatch.setattr(config, "TABLE", table)
    launch.clear_cache()
    chunkings = _record_backward_chunking(monkeypatch)
    torch.manual_seed(0)
    split = _check_against_truth(shape, torch.float16, group_size=group_size,
                                 norm_before_gate=norm_before_gate, rounding="te")
    launch.clear_cache()
    assert [args[1] for args, _ in chunkings] == [2 * triton.cdiv(group_size, block_n)]
    if norm_before_gate:
        assert torch.equal(split.dgate, default.dgate)


@pytest.mark.slow
@pytest.mark.parametrize("block_n", [1024, 2048, 8192], ids=lambda n: f"blocks_of_{n}")
@pytest.mark.parametrize("norm_before_gate", [True, False], ids=["norm_first", "gate_first"])
def test_long_row_backward_in_any_column_block_width(monkeypatch, block_n, norm_before_gate):
    # Two groups of 20000 cut into 20, 10 or 3 blocks (the last one partial; 20 and 10 are
    # not powers of two, so the dot products are read through a masked DOT_BLOCKS tile).
    _assert_any_column_block_width(monkeypatch, (3, 40000), 20000, block_n, norm_before_gate)


@pytest.mark.slow
def test_long_rows_with_strided_leading_dims():
    b, s, d = 2, 2, 16400
    x = torch.randn(s, b, d).to(torch.bfloat16).transpose(0, 1)
    proj = torch.randn(b, s, 2 * d).to(torch.bfloat16)
    gate = proj[..., d:]
    weight = (1 + 0.2 * torch.randn(d)).to(torch.bfloat16)
    dy = torch.randn(b, s, d).to(torch.bfloat16)
    _assert_same_as_contiguous(x, gate, weight, dy, rounding="te")


# ---------------------------------------------------------------------------------------------
# Row counts and the backward's fixed row partition.


@pytest.mark.parametrize("rows, dtype", [(1, torch.bfloat16), (1, torch.float16),
                                         (199, torch.bfloat16), (199, torch.float16),
                                         (1200, torch.bfloat16)],
                         ids=["rows1-bf16", "rows1-fp16", "rows199-bf16", "rows199-fp16",
                              "rows1200-bf16"])
def test_row_counts(rows, dtype):
    _check_against_truth((rows, 96), dtype, rounding="te", group_size=32)


@pytest.mark.parametrize("target_programs", [1, 2, 3], ids=lambda n: f"{n}_programs")
@pytest.mark.parametrize("shape", [
    pytest.param((199, 64), id="tile"), pytest.param((37, 4096), id="wide_row_tile"),
    pytest.param((5, 9000), id="long_row", marks=pytest.mark.slow)])
def test_any_row_partition_gives_the_same_dx_and_dgate(monkeypatch, target_programs, shape):
    # Few chunks: each program loops over several tiles (the last chunk partly full), in a
    # long row's two launches too. dx and dgate do not depend on the partition; dweight only
    # through the order of its fp32 sums.
    x, gate, weight, dy = make_inputs(shape, torch.float16)
    default = fused(x, gate, weight, dy)
    tile = config.backward_config(shape[-1])
    block_rows = tile.block_rows
    column_blocks = triton.cdiv(shape[-1], tile.block_n)  # 1 unless the row is split
    monkeypatch.setattr(config, "BACKWARD_TARGET_PROGRAMS", target_programs)
    # Entries with a measured count of their own take the default count instead.
    monkeypatch.setattr(config, "TABLE", {
        key: dataclasses.replace(entry, programs=None) if entry.pass_ == config.BACKWARD
        else entry for key, entry in config.TABLE.items()})
    # Launch plans are cached per shape: start from an empty cache so the patch is used.
    launch.clear_cache()
    chunkings = _record_backward_chunking(monkeypatch)
    rows_per_chunk, num_chunks = config.backward_chunking(shape[0], column_blocks, block_rows)
    assert num_chunks <= target_programs and rows_per_chunk > block_rows
    partitioned = fused(x, gate, weight, dy)
    launch.clear_cache()
    assert [result for _, result in chunkings] == [(rows_per_chunk, num_chunks)]
    assert torch.equal(partitioned.y, default.y)
    assert torch.equal(partitioned.dx, default.dx)
    assert torch.equal(partitioned.dgate, default.dgate)
    assert_finite(partitioned)
    assert_three_way(partitioned, composite(x, gate, weight, dy),
                     fp64_truth(x, gate, weight, dy), shape[0])
