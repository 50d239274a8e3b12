"""The forward's row-loop kernel (a table entry with loop_stages > 1) gives the tile kernel's
bits: the same arithmetic per tile, only the programs walk several tiles each."""

import dataclasses

import pytest
import torch

import gatednorm
from gatednorm.kernels import config, forward as forward_kernels, launch

pytestmark = pytest.mark.usefixtures("interpreter")
TABLE = dict(config.TABLE)


def _forward(x, gate, weight, **options):
    launch.clear_cache()
    return gatednorm.rms_norm_gated(x, gate, weight, **options)


LAYOUTS = {
    # name: (x, gate) builders over (t, h, d)
    "contiguous": lambda t, h, d: (torch.randn(t, h, d), torch.randn(t, h, d)),
    "sliced-gate": lambda t, h, d: (torch.randn(t, h, d),
                                    torch.randn(t, 3 * h * d)[:, h * d:2 * h * d].view(t, h, d)),
    "permuted": lambda t, h, d: (torch.randn(h, t, d).transpose(0, 1),
                                 torch.randn(h, t, d).transpose(0, 1)),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("d, group_size, norm_before_gate", [
    (128, None, True), (96, None, True), (192, 64, False), (1024, 256, False)],
    ids=["d128", "d96", "d192-groups64-gate_first", "d1024-groups256-gate_first"])
@pytest.mark.parametrize("target_programs", [1, 5], ids=["one-program", "five-programs"])
def test_row_loop_matches_the_tile_kernel(monkeypatch, layout, d, group_size, norm_before_gate,
                                          target_programs):
    torch.manual_seed(0)
    t, h = 13, 3  # 39 rows: no tile height divides it, chunks end mid-tile
    x, gate = (v.to(torch.float16) for v in LAYOUTS[layout](t, h, d))
    weight = (1 + 0.2 * torch.randn(d)).to(torch.float16)
    options = dict(group_size=group_size, norm_before_gate=norm_before_gate, rounding="te")
    launched = []
    original = launch.CachedLaunch

    def recording(kernel, meta):
        launched.append(kernel)
        return original(kernel, meta)

    monkeypatch.setattr(launch, "CachedLaunch", recording)

    def with_stages(stages):
        # The table's tiles at one prefetch depth: 1 runs the one-tile kernel, 2 the row loop.
        monkeypatch.setattr(config, "TABLE", {
            key: dataclasses.replace(entry, stages=stages)
            if entry.pass_ == config.FORWARD and entry.kind != config.LONG_ROW else entry
            for key, entry in TABLE.items()})

    with_stages(1)
    expected = _forward(x, gate, weight, **options)
    assert launched == [forward_kernels.forward_tile_kernel]

    with_stages(2)
    num_groups = d // (group_size or d)
    monkeypatch.setattr(config, "FORWARD_TARGET_PROGRAMS", target_programs * num_groups)
    got = _forward(x, gate, weight, **options)
    assert launched[1:] == [forward_kernels.forward_row_loop_kernel]
    assert torch.equal(got, expected)


@pytest.mark.parametrize("x_dtype, gate_dtype", [
    (torch.float32, torch.float32), (torch.float32, torch.bfloat16),
    (torch.bfloat16, torch.float32)], ids=["fp32", "fp32-bf16-gate", "bf16-fp32-gate"])
def test_an_fp32_input_keeps_the_one_tile_kernel(monkeypatch, x_dtype, gate_dtype):
    """The row loop's pipelined fp32 loads changed rstd's last bit between kernel variants on
    the GPU; the launcher keeps fp32 inputs on the one-tile kernel whatever the table says."""
    launched = []
    original = launch.CachedLaunch
    monkeypatch.setattr(launch, "CachedLaunch",
                        lambda kernel, meta: launched.append(kernel) or original(kernel, meta))
    x = torch.randn(39, 96, dtype=x_dtype)
    gate = torch.randn(39, 96, dtype=gate_dtype)
    assert config.forward_config(96).loop_stages > 1
    _forward(x, gate, None)
    assert launched == [forward_kernels.forward_tile_kernel]


@pytest.mark.parametrize("width", [8192, 16384])
def test_wide_row_loops_start_their_own_program_count(monkeypatch, width):
    """The 8192- and 16384-wide row loops are chunked for their own program counts
    (their table entries' programs), the narrower ones for FORWARD_TARGET_PROGRAMS; the
    chunking never changes the bits."""
    torch.manual_seed(0)
    x, gate = (torch.randn(8, width).to(torch.float16) for _ in range(2))
    assert config.forward_config(width).loop_stages > 1
    grids = {}
    outputs = {}
    for wide_target in (2, 8):
        monkeypatch.setattr(config, "FORWARD_TARGET_PROGRAMS", 4)
        for kind in (config.WHOLE, config.PARTIAL):
            entry = config.TABLE[("forward", width, kind)]
            monkeypatch.setitem(config.TABLE, ("forward", width, kind),
                                dataclasses.replace(entry, programs=wide_target))
        with torch.no_grad():
            outputs[wide_target] = _forward(x, gate, None)
        (plan,) = launch.cached_plans("fwd")
        assert plan.kernel is forward_kernels.forward_row_loop_kernel
        grids[wide_target] = plan.grid
    assert grids == {2: (2,), 8: (8,)}
    assert torch.equal(outputs[2], outputs[8])
