"""The benchmark cases: shapes, dtypes and gate layouts, their inputs and the bytes they move.

Four families:

- ``head``: the per-head norm of Gated DeltaNet / Qwen3-Next / Kimi Linear, ``y = norm(x) *
  act(gate)`` over a head dim of 128, x of shape [tokens, heads, 128]. Each shape is timed with
  a contiguous gate and with a gate sliced out of a projection output (``proj`` of shape
  [tokens, 3 * heads * 128], gate = ``proj[:, H*D:2*H*D].view(T, H, D)``), which is how a model
  produces it: row stride 3*H*D, not H*D.
- ``gate-first``: the Mamba2 / Nemotron-H norm, ``y = norm(x * silu(gate))`` over groups of the
  hidden dim: Mamba2 8192 x 5120 with 8 groups of 640, Nemotron-H 8192 x 8192 with groups of 1024.
- ``sweep``: ``y = norm(x) * silu(gate)`` over the whole last dim D, 64 to 32768, with
  ``SWEEP_ELEMENTS // D`` rows so that every point moves ~300 MB (bf16 forward) or more.
- ``decode``: [B, 32, 128] per-head inputs for B = 1 .. 4096 tokens (one token per sequence of a
  batch of B), the gate sliced from a projection as in a model. Forward only; timed per call.

Bytes counted (the floor every implementation must move, rstd and other per-row scalars left
out: 4 bytes per row against >= 256 bytes of row data):
forward reads x and gate and writes y; backward reads x, gate and dy and writes dx and dgate;
the weight is read once per pass and dweight written once in the backward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

PASSES = ("fwd", "bwd", "fwd+bwd")
GATE_LAYOUTS = ("contiguous", "proj")
# The projection a sliced gate comes from is this many times wider than the gate.
PROJ_WIDTH_FACTOR = 3
# Elements per sweep case (rows = SWEEP_ELEMENTS // D): 302 MB per bf16 forward.
SWEEP_ELEMENTS = 48 * 2**20
SWEEP_DIMS = (64, 96, 192, 256, 1024, 2048, 4096, 8192, 16384, 32768)
DECODE_TOKENS = (1, 4, 16, 64, 256, 1024, 4096)
DECODE_HEADS = 32
HEAD_DIM = 128
# (tokens, heads, activation) of the per-head cases.
HEAD_SHAPES = ((4096, 32, "silu"), (8192, 32, "silu"), (8192, 64, "silu"), (65536, 32, "silu"),
               (4096, 96, "sigmoid"))
# (model, tokens, hidden, group_size) of the gate-first cases.
GATE_FIRST_SHAPES = (("mamba2", 8192, 5120, 640), ("nemotronh", 8192, 8192, 1024))
# The fp16 / fp32 sweeps time gatednorm against the eager formulas only: torch.compile and
# FLA's autotuner spend seconds per new shape and dtype (about 2 minutes over these 20 cases),
# which a ~6 minute run cannot afford; they are compared in fp16 / fp32 on the head cases.
NO_COMPILE_PEERS = ("gatednorm", "hf-eager", "megatron-eager")
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


@dataclass
class Inputs:
    """One set of a case's tensors. ``gate`` may be a strided view into ``proj``; ``dy`` is None
    for decode cases (forward only)."""

    x: torch.Tensor
    gate: torch.Tensor
    weight: torch.Tensor
    dy: torch.Tensor | None
    proj: torch.Tensor | None

    def differentiable(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.x, self.gate, self.weight


@dataclass(frozen=True)
class Case:
    """One timed configuration. ``shape`` is x's shape; the op normalizes its last dim (in
    groups of ``group_size`` when set) and ``rows`` counts everything before it."""

    name: str
    family: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    gate_layout: str = "contiguous"
    activation: str = "silu"
    norm_before_gate: bool = True
    group_size: int | None = None
    # The providers a full run times on this case (None: all); the others are recorded as
    # "skipped" unless --all-peers is given.
    providers: tuple[str, ...] | None = None

    @property
    def rows(self) -> int:
        return math.prod(self.shape[:-1])

    @property
    def d(self) -> int:
        return self.shape[-1]

    @property
    def group(self) -> int:
        return self.d if self.group_size is None else self.group_size

    @property
    def is_decode(self) -> bool:
        return self.family == "decode"

    @property
    def dtype_name(self) -> str:
        return DTYPE_NAMES[self.dtype]

    @property
    def element_bytes(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def bytes_moved(self, pass_: str) -> int:
        """Bytes read plus written by an ideal implementation of ``pass_``."""
        activation = self.rows * self.d * self.element_bytes
        weight = self.d * self.element_bytes
        forward = 3 * activation + weight
        backward = 5 * activation + 2 * weight
        return {"fwd": forward, "bwd": backward, "fwd+bwd": forward + backward}[pass_]

    def bytes_allocated(self) -> int:
        """Bytes of one input set (x, the gate or the projection it is sliced from, dy)."""
        activation = self.rows * self.d * self.element_bytes
        gate = activation * (PROJ_WIDTH_FACTOR if self.gate_layout == "proj" else 1)
        return activation + gate + (0 if self.is_decode else activation)

    def make_inputs(self, device: torch.device, seed: int) -> Inputs:
        """Random inputs (never zeros): x, gate and dy ~ N(0, 1), weight ~ 1 + N(0, 0.1^2).

        Training cases get leaf tensors that require grad (the gate a strided leaf when
        sliced); decode cases get plain tensors.
        """
        generator = torch.Generator(device=device).manual_seed(seed)

        def randn(*shape: int) -> torch.Tensor:
            return torch.randn(shape, generator=generator, device=device, dtype=self.dtype)

        x = randn(*self.shape)
        proj = None
        if self.gate_layout == "proj":
            width = math.prod(self.shape[1:])
            proj = randn(self.shape[0], PROJ_WIDTH_FACTOR * width)
            gate = proj[:, width:2 * width].view(self.shape)
        else:
            gate = randn(*self.shape)
        noise = torch.randn(self.d, generator=generator, device=device)
        weight = (1.0 + 0.1 * noise).to(self.dtype)
        dy = None
        if not self.is_decode:
            dy = randn(*self.shape)
            for t in (x, gate, weight):
                t.requires_grad_(True)
        return Inputs(x=x, gate=gate, weight=weight, dy=dy, proj=proj)

    def describe(self) -> dict:
        """The JSON fields that identify the case."""
        return {
            "case": self.name, "family": self.family, "shape": list(self.shape),
            "rows": self.rows, "d": self.d, "dtype": self.dtype_name,
            "gate_layout": self.gate_layout, "activation": self.activation,
            "norm_before_gate": self.norm_before_gate, "group_size": self.group,
        }


def _layout_tag(layout: str) -> str:
    return "contig" if layout == "contiguous" else layout


def head_case(tokens: int, heads: int, dtype: torch.dtype, layout: str,
              activation: str = "silu", head_dim: int = HEAD_DIM) -> Case:
    return Case(
        name=f"head{head_dim}-{tokens}x{heads}-{activation}-{DTYPE_NAMES[dtype]}-"
             f"{_layout_tag(layout)}",
        family="head", shape=(tokens, heads, head_dim), dtype=dtype, gate_layout=layout,
        activation=activation)


def gate_first_case(model: str, tokens: int, hidden: int, group_size: int,
                    dtype: torch.dtype, layout: str) -> Case:
    return Case(
        name=f"{model}-{tokens}x{hidden}-g{group_size}-{DTYPE_NAMES[dtype]}-{_layout_tag(layout)}",
        family="gate-first", shape=(tokens, hidden), dtype=dtype, gate_layout=layout,
        norm_before_gate=False, group_size=group_size)


def sweep_case(d: int, dtype: torch.dtype, rows: int | None = None,
               providers: tuple[str, ...] | None = None) -> Case:
    rows = max(1, SWEEP_ELEMENTS // d) if rows is None else rows
    return Case(name=f"sweep-d{d}-{rows}r-{DTYPE_NAMES[dtype]}", family="sweep",
                shape=(rows, d), dtype=dtype, providers=providers)


def decode_case(tokens: int, heads: int = DECODE_HEADS, head_dim: int = HEAD_DIM,
                dtype: torch.dtype = torch.bfloat16) -> Case:
    return Case(name=f"decode-{tokens}x{heads}x{head_dim}-{DTYPE_NAMES[dtype]}", family="decode",
                shape=(tokens, heads, head_dim), dtype=dtype, gate_layout="proj")


def full_cases() -> list[Case]:
    """Every case, most important first (a run cut short by --budget-s loses the tail)."""
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    cases = [head_case(t, h, bf16, layout, act)
             for t, h, act in HEAD_SHAPES for layout in GATE_LAYOUTS]
    cases += [gate_first_case(*shape, bf16, layout)
              for shape in GATE_FIRST_SHAPES for layout in GATE_LAYOUTS]
    cases += [decode_case(tokens) for tokens in DECODE_TOKENS]
    cases += [sweep_case(d, bf16) for d in SWEEP_DIMS]
    cases += [head_case(8192, 32, dtype, layout)
              for dtype in (fp16, fp32) for layout in GATE_LAYOUTS]
    cases += [sweep_case(d, dtype, providers=NO_COMPILE_PEERS)
              for dtype in (fp16, fp32) for d in SWEEP_DIMS]
    return cases


def quick_cases() -> list[Case]:
    """A representative subset for a fast look: about a third of the full run."""
    bf16 = torch.bfloat16
    cases = [head_case(8192, 32, bf16, layout) for layout in GATE_LAYOUTS]
    cases += [head_case(65536, 32, bf16, "proj"), head_case(4096, 96, bf16, "proj", "sigmoid")]
    cases += [gate_first_case(*shape, bf16, "proj") for shape in GATE_FIRST_SHAPES]
    cases += [decode_case(tokens) for tokens in (1, 64, 4096)]
    cases += [sweep_case(d, bf16) for d in (64, 256, 2048, 8192, 32768)]
    cases += [head_case(8192, 32, dtype, "contiguous") for dtype in (torch.float16, torch.float32)]
    return cases


def smoke_cases() -> list[Case]:
    """Tiny shapes covering every family, dtype, layout, activation and kernel path (one
    long-row case, D = 32768), for a CPU run of the whole benchmark."""
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    return [
        head_case(4, 2, bf16, "contiguous"),
        head_case(4, 2, bf16, "proj"),
        head_case(3, 3, bf16, "proj", "sigmoid"),
        head_case(4, 2, fp16, "contiguous"),
        head_case(4, 2, fp32, "proj"),
        gate_first_case("mamba2", 4, 256, 64, bf16, "proj"),
        sweep_case(96, bf16, rows=5),
        sweep_case(32768, fp32, rows=2, providers=NO_COMPILE_PEERS),
        decode_case(1, heads=2),
        decode_case(4, heads=2),
    ]


def select(cases: list[Case], patterns: str | None) -> list[Case]:
    """Cases whose name contains any of the comma-separated substrings (all for None)."""
    if not patterns:
        return cases
    wanted = [p for p in patterns.split(",") if p]
    return [c for c in cases if any(p in c.name for p in wanted)]
