"""Two CUDA ranks with NCCL: every DTensor placement rule bit for bit against one GPU, the
tensor-parallel, sequence-parallel, FSDP2 and Megatron plans trained against one GPU, and
torch.compile of the tensor-parallel model. Skipped on fewer than two GPUs."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from distributed_workers import launch  # noqa: E402

pytestmark = [
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"),
    pytest.mark.timeout(600),
]

JOBS = ["placements", "distributed_training.tensor_and_sequence_parallel",
        "distributed_training.fsdp", "distributed_training.megatron_sequence_parallel",
        "distributed_training.compiled_tensor_parallel"]


@pytest.mark.parametrize("job", JOBS)
def test_two_cuda_ranks_match_one_gpu(job):
    launch(job, 2, interpret=False, backend="nccl", timeout_s=540)
