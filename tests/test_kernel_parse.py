"""Every kernel variant parses to Triton IR, also with its integer arguments as constants.

Inductor's parse of user kernels (torch.compile) turns integer arguments equal to 1 into
Python constants; see tests/parse_kernels.py. No GPU needed, but the parse must run without
the interpreter, hence a subprocess.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("parse_kernels.py")
KERNELS = ["forward_tile", "forward_row_loop", "forward_long_row", "backward_tile",
           "backward_split_row_dots", "backward_split_input_grads", "dweight_reduce",
           # The eager launches' programmatic-launch variants (never traced by Inductor, but
           # they must build for sm_90 like the rest).
           "backward_tile_pdl", "backward_split_input_grads_pdl", "dweight_reduce_pdl"]


@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_parses_with_integer_arguments_as_constants(kernel):
    env = dict(os.environ, TRITON_INTERPRET="0",
               PYTHONPATH=os.pathsep.join(filter(None, [str(SCRIPT.parent.parent),
                                                        os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, str(SCRIPT), kernel], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]


def test_kernel_sources_hold_no_backslash_escapes():
    # Inductor copies every jit function a user kernel calls into the Python file it generates
    # (the GPU's definitions: inline PTX where the interpreter has plain Triton), where an
    # escaped newline inside an asm string became a real one and broke the file's import
    # (variant 49's first GPU run, session 18). Checked on the compiled-mode sources, in a
    # subprocess.
    source = (
        "import triton\n"
        "from gatednorm.kernels import backward, forward, pointwise\n"
        "bad = [f'{m.__name__}.{name}' for m in (backward, forward, pointwise)\n"
        "       for name, fn in vars(m).items()\n"
        "       if isinstance(fn, triton.JITFunction) and chr(92) in fn.src]\n"
        "print(bad)\n"
        "raise SystemExit(1 if bad else 0)\n")
    env = dict(os.environ, TRITON_INTERPRET="0",
               PYTHONPATH=os.pathsep.join(filter(None, [str(SCRIPT.parent.parent),
                                                        os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, "-c", source], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
