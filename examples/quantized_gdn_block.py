"""Train a Gated DeltaNet output block with an FP8 output projection next to its bf16 twin.

    python examples/quantized_gdn_block.py                 # CUDA if available, else CPU
    python examples/quantized_gdn_block.py --steps 50 --device cpu

The block is a GDN layer's output end: the attention output o [tokens, heads * head_dim] is
normalized per head and gated (gatednorm.RMSNormGated, group_size = head_dim), then projected
back to the hidden size. In the FP8 run the norm writes the projection's FP8 input itself
(1x128 blocks, column-major scales: what torch's blockwise scaled_mm and DeepGEMM take) and
gatednorm.quantize.fp8_linear multiplies it by the weight quantized in 128x128 blocks (cuBLAS's
blockwise FP8 GEMM on an H100/H200 with torch >= 2.10, else the same values dequantized). The
gradient comes back in high precision through the quantized output's anchor. Both runs start
from the same weights and see the same batches; the two loss curves are printed side by side.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import gatednorm
from gatednorm.quantize.linear import fp8_linear


class GatedOutputBlock(torch.nn.Module):
    def __init__(self, heads: int, head_dim: int, hidden: int, fp8: bool):
        super().__init__()
        self.norm = gatednorm.RMSNormGated(heads * head_dim, group_size=head_dim,
                                           quantize="1x128_column" if fp8 else None)
        self.out_proj = torch.nn.Parameter(torch.randn(hidden, heads * head_dim) * 0.02)
        self.fp8 = fp8

    def forward(self, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        if self.fp8:
            return fp8_linear(self.norm(o, gate), self.out_proj)
        return self.norm(o, gate) @ self.out_proj.t()


def train(fp8: bool, args, device, dtype) -> list[float]:
    torch.manual_seed(0)
    width = args.heads * args.head_dim
    teacher = torch.randn(args.hidden, width, device=device) * 0.05
    block = GatedOutputBlock(args.heads, args.head_dim, args.hidden, fp8).to(device, dtype)
    optimizer = torch.optim.Adam(block.parameters(), lr=args.lr)
    batches = torch.Generator(device=device).manual_seed(1)
    losses = []
    for _ in range(args.steps):
        o = torch.randn(args.tokens, width, device=device, generator=batches)
        gate = torch.randn(args.tokens, width, device=device, generator=batches)
        target = (o * F.silu(gate)) @ teacher.t()
        loss = F.mse_loss(block(o.to(dtype), gate.to(dtype)).float(), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16
    bf16, fp8 = train(False, args, device, dtype), train(True, args, device, dtype)
    print(f"{'step':>6s} {'bf16 loss':>12s} {'fp8 loss':>12s}")
    stride = max(1, args.steps // 10)
    for step in sorted({0, *range(stride - 1, args.steps, stride)}):
        print(f"{step + 1:6d} {bf16[step]:12.6f} {fp8[step]:12.6f}")
    tail = max(1, args.steps // 6)
    print(f"mean of the last {tail} steps: bf16 {sum(bf16[-tail:]) / tail:.6f}, "
          f"fp8 {sum(fp8[-tail:]) / tail:.6f}")


if __name__ == "__main__":
    main()
