"""Elementwise pieces shared by the forward and backward kernels.

Every function works on fp32 tiles of any shape. Rounding to a narrower dtype is written as a
round trip (``t.to(dtype).to(fp32)``) at exactly the places where the unfused composite in
``gatednorm.reference`` materializes a tensor in that dtype.

WEIGHT_PRODUCT_ROUNDED ("hf" only): the weight times the rounded normalized value is itself a
16-bit tensor in the composite, which happens when the weight has x's (16-bit) dtype.

Constexpr flag values (launch.py maps the public strings): ACTIVATION 0 = silu, 1 = sigmoid;
ROUNDING 0 = "te", 1 = "fp32", 2 = "hf". They stay plain integers: module-level constexpr
aliases used inside kernels break Inductor's tracing of user kernels.
"""

import os

import torch
import triton
import triton.language as tl


@triton.jit
def fp32_argument(value):
    """A float argument as fp32. Triton's launcher passes a Python float as fp32; Inductor
    passes it to a user-defined kernel as fp64 (torch >= 2.10), which would promote rstd's
    and y's arithmetic to fp64 and give a compiled call other bits than an eager one.
    (tl.cast: the interpreter passes the Python float itself, which has no .to().)"""
    return tl.cast(value, tl.float32)


if os.environ.get("TRITON_INTERPRET", "0") == "1" or torch.version.hip:
    @triton.jit
    def reciprocal(t):
        """1 / t. The interpreter (and a ROCm build) has no PTX; Triton's division."""
        return 1.0 / t
else:
    @triton.jit
    def reciprocal(t):
        """1 / t by the hardware's approximate reciprocal, flush-to-zero (rcp.approx.ftz,
        at most 1 ulp from the quotient). Triton's `/` adds a range fix-up for |t| > 2**126,
        five instructions an element, that matters only where the result is subnormal."""
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [t],
                                         dtype=tl.float32, is_pure=True, pack=1)


if os.environ.get("TRITON_INTERPRET", "0") == "1" or torch.version.hip:
    @triton.jit
    def store_row_values(pointers, values, mask):
        """tl.store(pointers, values, mask). No PTX here (interpreter, ROCm)."""
        tl.store(pointers, values, mask=mask)
else:
    @triton.jit
    def store_row_values(pointers, values, mask):
        """Store one fp32 value per row of a tile (rstd) from the reduction's own layout.

        ``tl.store`` gives a 1-D store a fresh coalesced layout, and moving the reduced values
        into it goes through shared memory with two barriers and holds registers: up to 8 %
        of the GDN forward on the H200 (docs/perf-notes.md, variant 27). Here each thread
        stores the rows it holds with an inline ``st.global`` (lanes that hold the same row
        store the same value to the same address). torch.compile's mutation analysis cannot
        see a store inside inline assembly: traced launches use ``tl.store``.
        """
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p st.global.b32 [$1], $2; "
            "mov.b32 $0, 0; }",
            "=r,l,r,r", [pointers.to(tl.int64), values, mask.to(tl.int32)],
            dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def round_to(t, dtype: tl.constexpr):
    return t.to(dtype).to(tl.float32)


if os.environ.get("TRITON_INTERPRET", "0") == "1" or torch.version.hip:
    @triton.jit
    def round_pairs(t, dtype: tl.constexpr):
        """t rounded to ``dtype`` (nearest even), as fp32."""
        return round_to(t, dtype)
else:
    @triton.jit
    def round_pairs(t, dtype: tl.constexpr):
        """t rounded to ``dtype`` (nearest even), as fp32. 16-bit dtypes round two values
        an instruction (cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32, the same rounding as one
        value's cvt, which takes a quarter-rate conversion instruction a value on Hopper).
        Where the rounded value is only stored in that dtype, or multiplied in it ("hf"'s
        weight product), round_to is cheaper: the compiler folds it into the store's
        conversion or into a 16-bit multiply, which it cannot see through inline PTX."""
        if dtype == tl.bfloat16:
            return tl.inline_asm_elementwise(
                "{ .reg .b32 p; cvt.rn.bf16x2.f32 p, $3, $2; "
                "shl.b32 $0, p, 16; and.b32 $1, p, 0xffff0000; }",
                "=r,=r,r,r", [t], dtype=tl.float32, is_pure=True, pack=2)
        elif dtype == tl.float16:
            return tl.inline_asm_elementwise(
                "{ .reg .b32 p; .reg .b16 lo, hi; cvt.rn.f16x2.f32 p, $3, $2; "
                "mov.b32 {lo, hi}, p; cvt.f32.f16 $0, lo; cvt.f32.f16 $1, hi; }",
                "=r,=r,r,r", [t], dtype=tl.float32, is_pure=True, pack=2)
        else:
            return round_to(t, dtype)


@triton.jit
def load_gamma(W, offsets, mask, HAS_WEIGHT: tl.constexpr, ZERO_CENTERED: tl.constexpr):
    """The fp32 scale: weight, 1 + weight when zero-centered, or 1 without a weight."""
    gamma = 1.0
    if HAS_WEIGHT:
        gamma = tl.load(W + offsets, mask=mask, other=0.0).to(tl.float32)
        if ZERO_CENTERED:
            gamma = gamma + 1.0
    return gamma


@triton.jit
def activation_and_slope(g, ACTIVATION: tl.constexpr):
    """act(g) and act'(g). SiLU is written as g / (1 + exp(-g)), as PyTorch computes it.

    exp(-g) is exp2(g * -log2(e)): the product is the one tl.exp forms (negation is exact),
    and exp2 lowers to the flush-to-zero ex2 without tl.exp's subnormal-result fix-up
    (four instructions an element); a subnormal exp(-g) only ever meets 1.0 + it, which
    rounds to 1.0 either way.
    """
    denominator = 1.0 + tl.exp2(g * -1.4426950408889634)
    sig = reciprocal(denominator)
    if ACTIVATION == 0:
        act = g * sig
        slope = sig * (1.0 + g * (1.0 - sig))
    else:
        act = sig
        slope = sig * (1.0 - sig)
    return act, slope


@triton.jit
def leading_offsets(rows_idx, size1, size2, stride0, stride1, stride2,
                    LEADING_DIMS: tl.constexpr):
    """Element offset (int64) of each row, for up to three collapsed leading dims.

    The row index is split into its coordinates in int32: an int64 division is a long
    instruction sequence, and it sits on the address path of every tile (a gate sliced from
    a projection output has two leading dims). Validation keeps the row count under 2**31, so
    the narrowing is exact for every row in bounds; rows past the end wrap, but are masked.
    """
    if LEADING_DIMS == 1:
        offsets = rows_idx.to(tl.int64) * stride2
    else:
        r = rows_idx.to(tl.int32)
        inner = (r % size2).to(tl.int64)
        outer = r // size2
        if LEADING_DIMS == 2:
            offsets = outer.to(tl.int64) * stride1 + inner * stride2
        else:
            offsets = ((outer // size1).to(tl.int64) * stride0
                       + (outer % size1).to(tl.int64) * stride1 + inner * stride2)
    return offsets


@triton.jit
def row_offsets(rows_idx, size1, size2, stride0, stride1, stride2, group_offset,
                LEADING_DIMS: tl.constexpr, ROW_ALIGN: tl.constexpr):
    """Element offset (int64) of each row's group, hinted as a multiple of ROW_ALIGN: every
    row start is one (layout.row_align, at most 8: 16-byte loads and stores of 16-bit data;
    a table entry may cap it, LaunchConfig.max_vector_elements)."""
    offsets = leading_offsets(rows_idx, size1, size2, stride0, stride1, stride2,
                              LEADING_DIMS) + group_offset
    return tl.multiple_of(offsets, ROW_ALIGN)


@triton.jit
def row_offsets_or(x_rows, rows_idx, size1, size2, stride0, stride1, stride2, group_offset,
                   LEADING_DIMS: tl.constexpr, ROW_ALIGN: tl.constexpr,
                   AS_X: tl.constexpr):
    """row_offsets of another tensor, or ``x_rows`` when the launcher found its row strides
    equal to x's (AS_X): each tensor's offsets cost a multiply (two or three leading dims: a
    division too) per row, and most calls pass x, the gate and the outputs alike contiguous."""
    if AS_X:
        offsets = x_rows
    else:
        offsets = row_offsets(rows_idx, size1, size2, stride0, stride1, stride2, group_offset,
                              LEADING_DIMS, ROW_ALIGN)
    return offsets


@triton.jit
def row_step(size2, stride1, stride2, STEP: tl.constexpr, UNIT: tl.constexpr):
    """(step, wrapped_step): how a row's element offset changes from row r to row r + STEP
    with two leading dims, in units of UNIT elements (every stride is a multiple of UNIT).

    r = outer * size2 + inner: STEP rows move inner by STEP % size2 and outer by
    STEP // size2, plus one more outer step (and inner back by size2) when inner passes
    size2, which happens at most once as STEP % size2 < size2; the caller tracks inner to
    know which of the two applies.
    """
    # tl.cast, not .to(): Inductor's parse of the kernel passes integer arguments equal to 1
    # as Python ints, which have no .to().
    size2 = tl.cast(size2, tl.int64)
    step = (STEP // size2) * tl.cast(stride1, tl.int64) + (STEP % size2) * stride2
    wrapped_step = step + stride1 - size2 * stride2
    return step // UNIT, wrapped_step // UNIT


@triton.jit
def gated_input(x, act, X_DTYPE: tl.constexpr, NORM_BEFORE_GATE: tl.constexpr,
                ROUNDING: tl.constexpr):
    """The tensor the statistics are taken over: x, or x * act(gate) when the gate comes first."""
    if NORM_BEFORE_GATE:
        h = x
    else:
        h = x * act
        if ROUNDING == 0:
            # TE materializes the gated input in x's dtype before its RMSNorm.
            h = round_to(h, X_DTYPE)
    return h


@triton.jit
def forward_output(h_hat, act, gamma, X_DTYPE: tl.constexpr, WEIGHT_PRODUCT_ROUNDED: tl.constexpr,
                   HAS_WEIGHT: tl.constexpr, NORM_BEFORE_GATE: tl.constexpr,
                   ROUNDING: tl.constexpr):
    """y in fp32 (before the final rounding) from the normalized input h * rstd."""
    if NORM_BEFORE_GATE:
        if ROUNDING == 0:
            if HAS_WEIGHT:
                y = round_pairs(h_hat * gamma, X_DTYPE) * act
            else:
                y = round_pairs(h_hat, X_DTYPE) * act
        elif ROUNDING == 1:
            if HAS_WEIGHT:
                y = h_hat * gamma * act
            else:
                y = h_hat * act
        else:
            y = round_to(h_hat, X_DTYPE)
            if HAS_WEIGHT:
                y = gamma * y
                if WEIGHT_PRODUCT_ROUNDED:
                    y = round_to(y, X_DTYPE)
            y = y * act
    else:
        if ROUNDING == 2:
            y = round_to(h_hat, X_DTYPE)
            if HAS_WEIGHT:
                y = gamma * y
        else:
            if HAS_WEIGHT:
                y = h_hat * gamma
            else:
                y = h_hat
    return y


@triton.jit
def backward_pointwise(act, slope, dy, h_hat, gamma, X_DTYPE: tl.constexpr,
                       G_DTYPE: tl.constexpr, WEIGHT_PRODUCT_ROUNDED: tl.constexpr,
                       HAS_WEIGHT: tl.constexpr,
                       NORM_BEFORE_GATE: tl.constexpr, ROUNDING: tl.constexpr):
    """The gradient reaching the normalized input, and the per-element dweight term.

    Returns (grad_h_hat, dweight_term, dgate). grad_h_hat is the gradient with
    respect to h * rstd, gamma included; the row reduction that turns it into the gradient of
    the norm's input is the caller's. dgate is final only when the gate comes after the norm.
    """
    if NORM_BEFORE_GATE:
        # v: the normalized value the gate multiplies, at the precision the composite keeps it.
        if ROUNDING == 0:
            if HAS_WEIGHT:
                v = round_to(h_hat * gamma, X_DTYPE)
            else:
                v = round_to(h_hat, X_DTYPE)
            dv = round_to(dy * act, X_DTYPE)
            grad_h_hat = dv
            if HAS_WEIGHT:
                grad_h_hat = dv * gamma
            dweight_term = dv * h_hat
        elif ROUNDING == 1:
            if HAS_WEIGHT:
                v = h_hat * gamma
            else:
                v = h_hat
            dv = dy * act
            grad_h_hat = dv
            if HAS_WEIGHT:
                grad_h_hat = dv * gamma
            dweight_term = dv * h_hat
        else:
            n0 = round_to(h_hat, X_DTYPE)
            if HAS_WEIGHT:
                v = gamma * n0
                dv = dy * act
                if WEIGHT_PRODUCT_ROUNDED:
                    v = round_to(v, X_DTYPE)
                    dv = round_to(dv, X_DTYPE)
                grad_h_hat = round_to(dv * gamma, X_DTYPE)
            else:
                v = n0
                dv = round_to(dy * act, X_DTYPE)
                grad_h_hat = dv
            dweight_term = dv * n0
        dgate = round_to(dy * v * slope, G_DTYPE)
    else:
        # Gate first: dgate needs the input gradient of the norm; backward_inputs computes it.
        dgate = slope
        if ROUNDING == 2:
            if HAS_WEIGHT:
                grad_h_hat = round_to(dy * gamma, X_DTYPE)
            else:
                grad_h_hat = dy
            dweight_term = dy * round_to(h_hat, X_DTYPE)
        else:
            grad_h_hat = dy
            if HAS_WEIGHT:
                grad_h_hat = dy * gamma
            dweight_term = dy * h_hat
    return grad_h_hat, dweight_term, dgate


@triton.jit
def backward_inputs(x, grad_h_in, act, slope, dgate_gate_after, X_DTYPE: tl.constexpr,
                    G_DTYPE: tl.constexpr, NORM_BEFORE_GATE: tl.constexpr,
                    ROUNDING: tl.constexpr):
    """dx and dgate (fp32, rounded values) from the gradient at the norm's input."""
    if NORM_BEFORE_GATE:
        dx = grad_h_in
        dgate = dgate_gate_after
    else:
        dh = grad_h_in
        if ROUNDING == 0:
            # TE's RMSNorm backward hands back dh in the dtype of its input.
            dh = round_to(dh, X_DTYPE)
        dx = dh * act
        dgate = round_to(dh * x * slope, G_DTYPE)
    return dx, dgate
