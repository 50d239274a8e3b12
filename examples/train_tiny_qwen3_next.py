"""Train a tiny Qwen3-Next with and without gatednorm and print the two loss curves side by side.

    python examples/train_tiny_qwen3_next.py        # CUDA (bf16) if available, else CPU (fp32)
    python examples/train_tiny_qwen3_next.py --device cpu --dtype bfloat16 --steps 10

The model is built from a config (random init, nothing downloaded): hidden 64, one Gated DeltaNet
layer and one attention layer, a 4-expert MoE, vocabulary 128. It learns to continue a few fixed
random token sequences. Both runs start from the same weights and see the same batches; the
patched copy has its Qwen3NextRMSNormGated replaced by gatednorm (``"hf"`` rounding, the
module's own numerics). On CPU without TRITON_INTERPRET both runs use eager PyTorch and the
curves are identical to the bit; on CUDA the patched run uses the Triton kernels and the curves
agree to within rounding.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

from gatednorm.integrations import transformers as gn_transformers

VOCAB = 128


def tiny_config() -> Qwen3NextConfig:
    return Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"], num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=32)


def batches(steps: int, batch: int, seq_len: int, device) -> list[torch.Tensor]:
    """``steps`` batches drawn from 8 fixed random sequences, so the loss has something to learn."""
    generator = torch.Generator().manual_seed(1)
    corpus = torch.randint(0, VOCAB, (8, seq_len), generator=generator)
    picks = torch.randint(0, len(corpus), (steps, batch), generator=generator)
    return [corpus[p].to(device) for p in picks]


def train(model: torch.nn.Module, data: list[torch.Tensor], lr: float) -> list[float]:
    """AdamW on the next-token loss; returns the loss of every step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses = []
    for ids in data:
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    # bf16 by default on CUDA; fp32 on CPU, where PyTorch's bf16 kernels are several times slower.
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()
    dtype_name = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    dtype = getattr(torch, dtype_name)

    start = time.perf_counter()
    torch.manual_seed(0)
    model = Qwen3NextForCausalLM(tiny_config()).to(args.device, dtype)
    # Patch a copy, so that both runs start from the same weights.
    patched = copy.deepcopy(model)
    report = gn_transformers.patch(patched)  # checked against the original on a probe
    print(f"device {args.device}, {dtype_name}; gatednorm replaced: {', '.join(report.replaced)}")

    data = batches(args.steps, args.batch, args.seq_len, args.device)
    reference = train(model, data, args.lr)
    fused = train(patched, data, args.lr)

    print(f"{'step':>4}  {'transformers':>12}  {'gatednorm':>12}  {'difference':>10}")
    for step, (a, b) in enumerate(zip(reference, fused), start=1):
        print(f"{step:>4}  {a:>12.6f}  {b:>12.6f}  {b - a:>10.2e}")
    largest = max(abs(b - a) for a, b in zip(reference, fused))
    verdict = "identical" if largest == 0 else f"largest difference {largest:.2e}"
    # Not a benchmark: at this size the run is all launch overhead and, on CPU, eager PyTorch.
    print(f"loss curves: {verdict} ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
