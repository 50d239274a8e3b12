"""benchmarks/sass_fingerprint.py keeps up with the kernels it fingerprints.

A refactor is judged by diffing the fingerprints before and after (benchmarks/README.md); a
configuration that no longer names a kernel's compile-time parameters would fail to compile
there, or, worse, a kernel left out would never be compared. This checks, without compiling,
that every configuration names exactly its kernel's constexpr parameters and that every
kernel the launchers start is fingerprinted. It runs in a subprocess: the tool sets
TRITON_INTERPRET=0 for the compiler, which must not leak into this worker.
"""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

CHECK = r"""
import sass_fingerprint as tool
from gatednorm.kernels import backward, forward
from gatednorm.quantize import columnwise
from gatednorm.quantize import kernels as quantized

every = list(tool.configurations())
covered = set()
for name, kernel, pointers, constexprs, num_warps, maxnreg in every:
    wanted = {n for n, p in zip(kernel.arg_names, kernel.params) if p.is_constexpr}
    assert set(constexprs) == wanted, (name, wanted ^ set(constexprs))
    runtime_pointers = {n for n in kernel.arg_names if n.isupper() and n not in wanted}
    assert runtime_pointers <= set(pointers), (name, runtime_pointers - set(pointers))
    covered.add(kernel.fn.__name__)
# Every kernel the launchers start: the modules' JIT functions named *_kernel.
launched = {name for module in (forward, backward, quantized, columnwise)
            for name, value in vars(module).items()
            if name.endswith("_kernel") and hasattr(value, "arg_names")
            and value.fn.__module__ == module.__name__}
missing = launched - covered
assert not missing, missing
assert len(launched) == 9, launched
print(len(every), "configurations")
"""


def test_fingerprint_configurations_name_every_constexpr_of_every_launched_kernel():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "benchmarks"), str(ROOT)]))
    proc = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.split()[0]) > 150, proc.stdout
