"""The backward's table tiles keep the registers, shared memory and occupancy recorded beside
their measured program counts.

The counts in config.BACKWARD_TILE_TARGET_PROGRAMS were measured for a tile at a given
register count: variant 28's kernel edit moved the gate-first 1024 tile from 218 to 168
registers, six programs an SM instead of four, and Nemotron-H's backward 11 % slower until the
count was measured again (docs/perf-notes.md, variants 36 and 38). This test compiles every
table tile for sm_90 with the ptxas in Triton's wheel (no GPU) and compares with the record, so
such a change is noticed when it is made. When it fails on purpose: re-measure the affected
tiles' program counts (benchmarks/launch_sweep.py --timer cold --targets ...) and regenerate
the record with ``python benchmarks/occupancy_table.py``.
"""

import os
import pathlib
import subprocess
import sys

import pytest
import triton

ROOT = pathlib.Path(__file__).resolve().parent.parent
RECORD = ROOT / "tests" / "data" / "backward-occupancy.txt"
# ptxas's register allocation is what is recorded: another Triton (another ptxas) may differ.
RECORDED_TRITON = "3.6.0"


@pytest.mark.skipif(triton.__version__ != RECORDED_TRITON,
                    reason=f"the record was made with Triton {RECORDED_TRITON}'s ptxas")
def test_backward_table_tiles_keep_their_recorded_occupancy():
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "occupancy_table.py")],
                          env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recorded = [line for line in RECORD.read_text().splitlines() if not line.startswith("#")]
    produced = proc.stdout.splitlines()
    changed = [f"  record: {old}\n  now:    {new}"
               for old, new in zip(recorded, produced) if old != new]
    assert len(produced) == len(recorded) and not changed, (
        "backward tiles compile to another occupancy than the one their program counts were "
        "measured at; re-measure those counts, then regenerate " + RECORD.name + ":\n"
        + "\n".join(changed))
