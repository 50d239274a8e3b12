"""DTensor inputs on CPU ranks (gloo): every placement rule, forward and backward, against the
single-device op on the same tensors, and the errors. Each test spawns one job that runs many
cases (tests/distributed_checks.py); the kernels run through the interpreter, the reference
path with it off."""

import pytest

from conftest import run_interpreted
from distributed_workers import launch

PATHS = [pytest.param(True, id="kernels-interpreted"), pytest.param(False, id="reference")]


@pytest.mark.parametrize("interpret", PATHS)
def test_each_placement_matches_one_device_on_two_ranks(interpret):
    launch("placements", 2, interpret=interpret)


@pytest.mark.slow
@pytest.mark.parametrize("interpret", PATHS)
def test_each_placement_matches_one_device_on_four_ranks(interpret):
    launch("placements", 4, interpret=interpret)


@pytest.mark.slow
@pytest.mark.parametrize("interpret", PATHS)
def test_rows_and_columns_sharded_on_a_two_dim_mesh(interpret):
    launch("placements_2d", 4, interpret=interpret)


def test_import_gatednorm_does_not_import_dtensor():
    # The rules register on the first DTensor call; plain users do not pay for the import.
    run_interpreted("import sys, torch, gatednorm\n"
                    "assert 'torch.distributed.tensor' not in sys.modules\n"
                    "assert 'gatednorm.distributed' not in sys.modules\n")
