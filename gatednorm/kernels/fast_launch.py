"""Relaunch an already compiled Triton kernel without Triton's per-call argument binding.

``JITFunction.run`` binds and specializes every argument on every call: on the H200 host that
is about 30 microseconds, several times the kernel itself at decode sizes. Once a plan (fixed
shapes, strides, dtypes and options) has compiled its kernel, the only thing left that can
change the compiled variant is the 16-byte alignment of the tensor pointers, so the compiled
kernel is cached on that and launched through its own launcher.

This reaches into Triton's CompiledKernel (``run``, ``function``, ``packed_metadata``),
which is stable across the 3.x releases but not public: whenever it is missing, a launch hook
is installed (profilers), or the kernel is interpreted, the normal ``kernel[grid](...)`` path
runs instead. With the Triton releases whose launcher was read (DIRECT_LAUNCH_TRITON), a kernel
that needs no scratch memory is launched through the launcher's compiled ``launch`` function
itself, skipping the Python ``CudaLauncher.__call__`` around it (which only allocates scratch).
"""

from __future__ import annotations

from functools import reduce
from operator import or_

import torch
import triton

try:
    from triton import knobs
    from triton.runtime.driver import driver
except ImportError:  # older Triton: always use the normal launch
    knobs = None
    driver = None

# Triton releases whose CudaLauncher.__call__ was read: it calls
# launch(gridX, gridY, gridZ, stream, function, launch_cooperative_grid, launch_pdl,
#        global_scratch, profile_scratch, *args) and does nothing else once both scratch
# sizes are 0 (tests/test_fast_launch.py checks the installed release's source).
DIRECT_LAUNCH_TRITON = ("3.6.",)


_data_ptr = torch.Tensor.data_ptr
# The compiled-variant key when every pointer is 16-byte aligned (else one bool per pointer).
ALL_ALIGNED = "all aligned"


def _hooks_installed() -> bool:
    """Whether a launch enter/exit hook (a profiler, proton) must see every launch. Triton
    3.6 keeps an empty ``HookChain`` where older releases keep None: both mean no hook."""
    for hook in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
        if hook is None:
            continue
        calls = getattr(hook, "calls", None)
        if calls is None or len(calls) > 0:
            return True
    return False


def _launchable(compiled) -> bool:
    return all(hasattr(compiled, name) for name in ("run", "function", "packed_metadata"))


def _launcher_and_head(compiled) -> tuple:
    """(fn, head): ``fn(gridX, gridY, gridZ, stream, *head, *kernel_args)`` launches
    ``compiled``. The launcher's compiled ``launch`` where that is known to be all its
    ``run`` does for this kernel, else ``run`` itself."""
    run = compiled.run
    launch = getattr(run, "launch", None)
    if (launch is not None and triton.__version__.startswith(DIRECT_LAUNCH_TRITON)
            and getattr(run, "global_scratch_size", 1) == 0
            and getattr(run, "profile_scratch_size", 1) == 0):
        return launch, (compiled.function, run.launch_cooperative_grid, run.launch_pdl,
                        None, None, compiled.packed_metadata, None, None, None)
    # run(gridX, gridY, gridZ, stream, function, packed_metadata, launch_metadata,
    #     enter_hook, exit_hook, *kernel_args)
    return run, (compiled.function, compiled.packed_metadata, None, None, None)


class CachedLaunch:
    """Launches of one kernel with one set of constexpr/meta arguments."""

    def __init__(self, kernel, meta: dict):
        self.kernel = kernel
        self.meta = meta
        self.compiled: dict[tuple, object] = {}
        # Per alignment key: (fn, head) of _launcher_and_head.
        self.relaunch: dict[tuple, tuple] = {}
        self.constexpr_values: tuple | None = None
        # Read at the first compile: a plan, and so its CachedLaunch, belongs to one device
        # (launch.py keys plans by device), and looking both up on every call costs about a
        # microsecond on a slow host.
        self.device_index: int | None = None
        self.current_stream = None

    def __call__(self, grid: tuple, tensors: tuple[torch.Tensor, ...], scalars: tuple) -> None:
        """Launch over ``grid`` with the kernel's leading pointer parameters ``tensors`` and
        its remaining runtime parameters ``scalars`` (constexprs come from ``meta``)."""
        if knobs is None or _hooks_installed():
            self.kernel[grid](*tensors, *scalars, **self.meta)
            return
        addresses = tuple(map(_data_ptr, tensors))
        # Nearly every call has every pointer 16-byte aligned: one OR decides that, where a
        # per-pointer tuple costs about a microsecond more per call on a slow host.
        key = (ALL_ALIGNED if reduce(or_, addresses) & 15 == 0
               else tuple(address % 16 == 0 for address in addresses))
        relaunch = self.relaunch.get(key)
        if relaunch is None:
            compiled = self.kernel[grid](*tensors, *scalars, **self.meta)
            if compiled is not None and _launchable(compiled):
                # The launcher takes every kernel parameter in order, constexprs included.
                names = self.kernel.arg_names[len(tensors) + len(scalars):]
                self.constexpr_values = tuple(self.meta[name] for name in names)
                self.compiled[key] = compiled
                self.relaunch[key] = _launcher_and_head(compiled)
                self.device_index = tensors[0].device.index
                self.current_stream = driver.active.get_current_stream
            return
        fn, head = relaunch
        stream = self.current_stream(self.device_index)
        # Addresses as ints: the launcher then skips its per-pointer data_ptr() call and
        # cuPointerGetAttribute check, which validation has already made (same CUDA device).
        fn(grid[0], grid[1] if len(grid) > 1 else 1, 1, stream, *head, *addresses, *scalars,
           *self.constexpr_values)
