"""Describe the rows of several same-shaped tensors without copying them.

The kernels address row ``r`` of a tensor through at most three leading dims, each with its
own stride per tensor. Leading dims that are contiguous with each other in every tensor are
merged first, so a plain contiguous tensor has one leading dim, a gate sliced out of a
projection output two, and a permuted [B, S, H, D] view at most three.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

MAX_LEADING_DIMS = 3
# Row starts that are multiples of this many elements allow 16-byte vector accesses.
VECTOR_ALIGN = 8


@dataclass(frozen=True)
class RowLayout:
    """rows = size0 * size1 * size2; strides[t] = (stride0, stride1, stride2) of tensor t;
    rows_as_first[t]: tensor t's rows start where the first tensor's do (equal strides), so a
    kernel may address both with one set of row offsets; row_align: every row and group starts
    at a multiple of this many elements (8, 4, 2 or 1: the kernels' ROW_ALIGN hint, so 16-,
    8-, 4- or 2-byte vectors of a 16-bit dtype)."""

    rows: int
    size1: int
    size2: int
    strides: tuple[tuple[int, int, int], ...]
    leading_dims: int
    row_align: int
    rows_as_first: tuple[bool, ...]


def _merged_leading_dims(tensors: list[torch.Tensor]) -> list[tuple[int, list[int]]]:
    shape = tensors[0].shape[:-1]
    dims: list[tuple[int, list[int]]] = []
    # Walk from the innermost leading dim outwards, merging a dim into the one inside it when
    # every tensor steps over the inner dim exactly once per step of the outer one.
    for axis in range(len(shape) - 1, -1, -1):
        size = shape[axis]
        if size == 1:
            continue
        strides = [t.stride(axis) for t in tensors]
        if dims:
            inner_size, inner_strides = dims[-1]
            if all(s == i * inner_size for s, i in zip(strides, inner_strides)):
                dims[-1] = (size * inner_size, inner_strides)
                continue
        dims.append((size, strides))
    dims.reverse()
    return dims


def row_layout(tensors: list[torch.Tensor], group_size: int) -> RowLayout | None:
    """The row layout shared by ``tensors`` (all [..., D], last dim unit-stride), or None
    when more than three leading dims stay apart after merging."""
    dims = _merged_leading_dims(tensors)
    if len(dims) > MAX_LEADING_DIMS:
        return None
    leading_dims = max(len(dims), 1)
    padded = [(1, [0] * len(tensors))] * (MAX_LEADING_DIMS - len(dims)) + dims
    rows = 1
    for size, _ in padded:
        rows *= size
    strides = tuple(tuple(padded[d][1][t] for d in range(MAX_LEADING_DIMS))
                    for t in range(len(tensors)))
    # Every row (and group) starts at a multiple of row_align elements: the largest power of
    # two up to VECTOR_ALIGN dividing every stride and the group size. Triton specializes the
    # base pointers' 16-byte alignment itself; only offsets need a hint.
    row_align = math.gcd(VECTOR_ALIGN, group_size,
                         *(s for per_tensor in strides for s in per_tensor))
    return RowLayout(
        rows=rows,
        size1=padded[1][0],
        size2=padded[2][0],
        strides=strides,
        leading_dims=leading_dims,
        row_align=row_align,
        rows_as_first=tuple(bool(per_tensor == strides[0]) for per_tensor in strides),
    )
