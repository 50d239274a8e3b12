"""Training a tiny gated block on CPU ranks (gloo) with the plans users write, against one
device: tensor parallel over heads, sequence parallel over tokens, FSDP2, Megatron's
sequence-parallel gradient reduction, and torch.compile(fullgraph=True) of the tensor-parallel
model (about 40 s a spawn on CPU: slow). See tests/distributed_training.py."""

import pytest

from distributed_workers import launch

PATHS = [pytest.param(True, id="kernels-interpreted"), pytest.param(False, id="reference")]


def test_tensor_and_sequence_parallel_train_like_one_device():
    launch("distributed_training.tensor_and_sequence_parallel", 2)


def test_fsdp2_trains_like_one_device():
    launch("distributed_training.fsdp", 2)


def test_megatron_sequence_parallel_reduction_gives_one_device_dweight():
    launch("distributed_training.megatron_sequence_parallel", 2)


@pytest.mark.slow
@pytest.mark.parametrize("interpret", PATHS)
@pytest.mark.parametrize("job", ["tensor_and_sequence_parallel", "fsdp"])
def test_plans_train_like_one_device_on_four_ranks(job, interpret):
    launch(f"distributed_training.{job}", 4, interpret=interpret)


@pytest.mark.slow
@pytest.mark.parametrize("job", ["tensor_and_sequence_parallel", "fsdp",
                                 "megatron_sequence_parallel"])
def test_plans_train_like_one_device_on_the_reference_path(job):
    launch(f"distributed_training.{job}", 2, interpret=False)


@pytest.mark.slow
@pytest.mark.parametrize("interpret", PATHS)
def test_compiled_tensor_parallel_model_trains_like_one_device(interpret):
    launch("distributed_training.compiled_tensor_parallel", 2, interpret=interpret)
