"""The backward's launch chain under programmatic dependent launch (sm_90+), checked on the
plans the eager launcher builds (no GPU needed: the launches are recorded, not run).

Each launch after the first must wait for its predecessor's writes (the dweight partials,
the row dot products) and be launched as a dependent; without support, or with the switch
off, no launch carries any of it."""

import pytest
import torch

from gatednorm.kernels import config, launch
from gatednorm.kernels.fast_launch import CachedLaunch


@pytest.fixture
def recorded(monkeypatch):
    """Launch metas in launch order; supported decides whether the device can chain."""
    launches = []
    monkeypatch.setattr(CachedLaunch, "__call__",
                        lambda self, grid, tensors, scalars: launches.append(
                            (self.kernel.fn.__name__, dict(self.meta))))
    launch.clear_cache()

    def run(shape, group_size, with_weight, supported=True):
        monkeypatch.setattr(launch, "_programmatic_launch_supported", lambda device: supported)
        launches.clear()
        x, gate, dy = (torch.randn(shape) for _ in range(3))
        weight = torch.ones(shape[-1]) if with_weight else None
        rstd = torch.ones(x.numel() // group_size)
        launch.backward(dy, x, gate, weight, rstd, zero_centered_gamma=False,
                        activation="silu", norm_before_gate=True, group_size=group_size,
                        rounding="te", traceable=False)
        return list(launches)

    return run


SHAPES = [((64, 128), 128), ((8, 2, 640), 640), ((4, 20000), 20000), ((4, 2 * 16384), 16384)]
NAMES = ["tile", "gate-first-groups", "long-row", "long-row-two-groups"]


@pytest.mark.parametrize("with_weight", [True, False], ids=["weight", "no-weight"])
@pytest.mark.parametrize("shape, group_size", SHAPES, ids=NAMES)
def test_each_launch_after_the_first_waits_for_its_predecessor(recorded, shape, group_size,
                                                               with_weight):
    launches = recorded(shape, group_size, with_weight)
    # The main kernel (two launches when the group is cut into column blocks), then the two
    # dweight reduction levels.
    expected = 1 + (group_size > 8192) + 2 * with_weight
    assert len(launches) == expected
    first, *rest = [meta for _, meta in launches]
    assert not first["WAIT_FOR_PRIOR_GRID"] and not first.get("launch_pdl", False)
    for meta in rest:
        assert meta["WAIT_FOR_PRIOR_GRID"] and meta["launch_pdl"]


@pytest.mark.parametrize("switch_off", [True, False], ids=["switched-off", "unsupported"])
@pytest.mark.parametrize("shape, group_size", SHAPES, ids=NAMES)
def test_plain_stream_order_without_support_or_switch(recorded, monkeypatch, shape, group_size,
                                                      switch_off):
    if switch_off:
        monkeypatch.setattr(config, "BACKWARD_PROGRAMMATIC_LAUNCH", False)
    launches = recorded(shape, group_size, True, supported=switch_off)
    assert launches
    for _, meta in launches:
        assert not meta["WAIT_FOR_PRIOR_GRID"]
        assert "launch_pdl" not in meta


def test_cpu_tensors_never_chain():
    # The interpreter and ROCm have no griddepcontrol instructions.
    assert not launch._programmatic_launch_supported(torch.device("cpu"))
