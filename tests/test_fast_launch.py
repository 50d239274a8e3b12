"""The relaunch cache of compiled kernels (gatednorm.kernels.fast_launch), with stand-ins for
Triton's JITFunction and CompiledKernel: argument order, grids, and when it must not cache."""

from types import SimpleNamespace

import pytest
import torch

from gatednorm.kernels import fast_launch


class FakeCompiled:
    function = "function-handle"
    packed_metadata = "packed"

    def __init__(self):
        self.runs = []

    def run(self, *call):
        self.runs.append(call)


class FakeKernel:
    """kernel[grid](*args, **meta) compiles (once per call here) and returns the compiled kernel."""

    arg_names = ["X", "Y", "n", "BLOCK", "FLAG"]

    def __init__(self, returns_compiled=True):
        self.calls = []
        self.returns_compiled = returns_compiled

    def __getitem__(self, grid):
        def launch(*args, **meta):
            self.calls.append((grid, args, meta))
            return FakeCompiled() if self.returns_compiled else None
        return launch


@pytest.fixture
def fake_driver(monkeypatch):
    streams = SimpleNamespace(get_current_stream=lambda index: f"stream{index}")
    monkeypatch.setattr(fast_launch, "driver", SimpleNamespace(active=streams))
    # Triton's own knobs as installed (Triton 3.6 keeps an empty HookChain there, not None).


def _tensors(offset_elements=0):
    base = torch.empty(64)
    return base[offset_elements:offset_elements + 8], torch.empty(8)


def test_second_call_relaunches_the_compiled_kernel_with_every_parameter_in_order(fake_driver):
    kernel = FakeKernel()
    launch = fast_launch.CachedLaunch(kernel, {"FLAG": True, "BLOCK": 16, "num_warps": 4})
    x, y = _tensors()
    launch((3, 2), (x, y), (8,))
    assert len(kernel.calls) == 1
    compiled = launch.compiled[fast_launch.ALL_ALIGNED]
    launch((5, 2), (x, y), (9,))
    assert len(kernel.calls) == 1, "the second call must not go through kernel[grid]"
    (call,) = compiled.runs
    # CPU tensors have no device index; the stand-in driver is asked for stream None.
    assert call[:9] == (5, 2, 1, "streamNone", "function-handle", "packed", None, None, None)
    # Pointers as addresses, the scalars, then the constexprs in the kernel's parameter order
    # (num_warps is an option, not a parameter).
    assert call[9:] == (x.data_ptr(), y.data_ptr(), 9, 16, True)


def test_a_new_pointer_alignment_compiles_a_new_variant(fake_driver):
    kernel = FakeKernel()
    launch = fast_launch.CachedLaunch(kernel, {"BLOCK": 16, "FLAG": False})
    x, y = _tensors()
    launch((1,), (x, y), (8,))
    unaligned, _ = _tensors(offset_elements=1)
    launch((1,), (unaligned, y), (8,))
    launch((1,), (y, unaligned), (8,))
    launch((1,), (unaligned, y), (8,))  # seen before: no new compile
    assert len(kernel.calls) == 3
    assert set(launch.compiled) == {fast_launch.ALL_ALIGNED, (False, True), (True, False)}


def test_interpreted_kernels_are_never_cached(fake_driver):
    kernel = FakeKernel(returns_compiled=False)
    launch = fast_launch.CachedLaunch(kernel, {"BLOCK": 16, "FLAG": False})
    x, y = _tensors()
    for _ in range(3):
        launch((1,), (x, y), (8,))
    assert len(kernel.calls) == 3
    assert not launch.compiled


def _knobs_with_hooks(enter, exit_):
    return SimpleNamespace(runtime=SimpleNamespace(launch_enter_hook=enter,
                                                   launch_exit_hook=exit_))


def _bound_calls_after_launches(monkeypatch, enter, exit_, launches: int) -> int:
    """Launch a CachedLaunch ``launches`` times with the given hooks installed; how many of
    the launches went through the kernel's normal (argument-binding) call."""
    monkeypatch.setattr(fast_launch, "knobs", _knobs_with_hooks(enter, exit_))
    kernel = FakeKernel()
    launch = fast_launch.CachedLaunch(kernel, {"BLOCK": 16, "FLAG": False})
    x, y = _tensors()
    for _ in range(launches):
        launch((1,), (x, y), (8,))
    return len(kernel.calls)


@pytest.mark.parametrize("hooks", ["enter", "exit", "enter-chain", "exit-chain"])
def test_a_launch_hook_forces_the_normal_path(fake_driver, monkeypatch, hooks):
    if hooks.endswith("chain"):
        chain = SimpleNamespace(calls=[print])
        enter, exit_ = (chain, None) if hooks.startswith("enter") else (None, chain)
    else:
        enter, exit_ = (print, None) if hooks == "enter" else (None, print)
    assert _bound_calls_after_launches(monkeypatch, enter, exit_, launches=2) == 2


@pytest.mark.parametrize("empty_hook", ["none", "empty-chain"])
def test_no_hook_installed_takes_the_relaunch_path(fake_driver, monkeypatch, empty_hook):
    hook = None if empty_hook == "none" else SimpleNamespace(calls=[])
    assert _bound_calls_after_launches(monkeypatch, hook, hook, launches=3) == 1


def test_the_installed_triton_has_no_launch_hook_by_default():
    """The relaunch path must be live with the Triton we ship against: its default knobs
    (None before 3.6, an empty HookChain since) count as no hook."""
    from triton import knobs
    if knobs.runtime.launch_enter_hook is not None:
        assert hasattr(knobs.runtime.launch_enter_hook, "calls")
    assert not fast_launch._hooks_installed()


class FakeLauncher:
    """A CompiledKernel.run of the shape DIRECT_LAUNCH_TRITON releases have."""

    launch_cooperative_grid = False
    launch_pdl = True

    def __init__(self, scratch_bytes):
        self.global_scratch_size = scratch_bytes
        self.profile_scratch_size = 0
        self.launches, self.runs = [], []
        self.launch = lambda *call: self.launches.append(call)

    def __call__(self, *call):
        self.runs.append(call)


@pytest.mark.parametrize("scratch_bytes", [0, 256])
def test_a_kernel_without_scratch_is_launched_by_the_compiled_launch_function(
        fake_driver, monkeypatch, scratch_bytes):
    monkeypatch.setattr(fast_launch, "DIRECT_LAUNCH_TRITON", (fast_launch.triton.__version__,))
    kernel = FakeKernel()
    launch = fast_launch.CachedLaunch(kernel, {"FLAG": True, "BLOCK": 16})
    x, y = _tensors()
    launch((3,), (x, y), (8,))
    launcher = FakeLauncher(scratch_bytes)
    launch.compiled[fast_launch.ALL_ALIGNED].run = launcher
    launch.relaunch.clear()
    launch.relaunch[fast_launch.ALL_ALIGNED] = fast_launch._launcher_and_head(
        launch.compiled[fast_launch.ALL_ALIGNED])
    launch((5,), (x, y), (9,))
    args = (x.data_ptr(), y.data_ptr(), 9, 16, True)
    if scratch_bytes:  # the scratch must be allocated by run itself
        assert launcher.launches == [] and launcher.runs == [
            (5, 1, 1, "streamNone", "function-handle", "packed", None, None, None, *args)]
    else:
        assert launcher.runs == [] and launcher.launches == [
            (5, 1, 1, "streamNone", "function-handle", False, True, None, None, "packed",
             None, None, None, *args)]


def test_the_installed_triton_launcher_does_what_the_direct_launch_assumes():
    """For a release in DIRECT_LAUNCH_TRITON, CudaLauncher.__call__ must pass its arguments to
    launch in the order _launcher_and_head builds them, after the (skipped) scratch allocation."""
    import inspect

    import triton

    if not triton.__version__.startswith(fast_launch.DIRECT_LAUNCH_TRITON):
        pytest.skip(f"Triton {triton.__version__} is not a direct-launch release")
    from triton.backends.nvidia.driver import CudaLauncher

    source = " ".join(inspect.getsource(CudaLauncher.__call__).split())
    assert "def __call__(self, gridX, gridY, gridZ, stream, function, *args):" in source
    assert ("self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, "
            "self.launch_pdl, global_scratch, profile_scratch, *args)") in source
