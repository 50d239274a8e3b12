"""The scripts in examples/ run as a user runs them (a fresh process, its command line) on the CPU,
through the Triton kernels (TRITON_INTERPRET=1), on sizes small enough for the interpreter.
The GPU suite trains the FP8 block for its full length (tests/gpu/test_gpu_quantized.py)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _run_example(name: str, *arguments: str) -> list[str]:
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run([sys.executable, str(EXAMPLES / name), *arguments], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.splitlines()


def _table(lines: list[str], header: str) -> list[list[str]]:
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [header])
    rows = []
    for line in lines[start + 1:]:
        fields = line.split()
        if not fields or not fields[0].isdigit():
            break
        rows.append(fields)
    return rows


def test_quantized_gdn_block_prints_each_step_with_fp8_next_to_bf16():
    lines = _run_example("quantized_gdn_block.py", "--device", "cpu", "--steps", "3",
                         "--tokens", "64")
    rows = _table(lines, "step")
    assert [int(row[0]) for row in rows] == [1, 2, 3]
    for _, bf16, fp8 in rows:
        bf16, fp8 = float(bf16), float(fp8)
        assert math.isfinite(bf16) and bf16 > 0
        # The FP8 projection's input error moves the loss by well under a percent here.
        assert abs(fp8 - bf16) <= 0.01 * bf16, (bf16, fp8)
    assert lines[-1].startswith("mean of the last 1 steps: bf16 ")


def test_train_tiny_qwen3_next_curves_agree():
    pytest.importorskip("transformers")
    lines = _run_example("train_tiny_qwen3_next.py", "--device", "cpu", "--steps", "3")
    assert "gatednorm replaced: model.layers.0.linear_attn.norm" in lines[0]
    rows = _table(lines, "step")
    assert [int(row[0]) for row in rows] == [1, 2, 3]
    for _, reference, fused, difference in rows:
        assert math.isfinite(float(reference))
        # fp32 on the CPU: the kernels reduce in another order than eager PyTorch.
        assert abs(float(fused) - float(reference)) <= 1e-5 * abs(float(reference))
    assert lines[-1].startswith("loss curves: ")
