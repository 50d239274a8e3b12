"""Spawned ranks of the distributed tests: ``launch(job, world_size)`` starts one process a rank
(gloo on CPU, NCCL on CUDA), rendezvous through a file, and runs the function ``job`` names
(``"module.function"``, or a function of tests/distributed_checks.py) on each. A job
asserts everything it checks; a rank that fails prints its traceback and exits non-zero, and
``launch`` raises with every rank's output. Each job batches many checks, because each spawn
imports torch (and Triton) once per rank.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def launch(job: str, world_size: int, *, interpret: bool = True, backend: str = "gloo",
           timeout_s: int = 300) -> list[str]:
    """Runs ``job`` on ``world_size`` ranks; returns each rank's stdout."""
    env = dict(os.environ, TRITON_INTERPRET="1" if interpret else "0",
               PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests"), str(REPO / "examples"),
                                           os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        rendezvous = f"file://{tmp}/rendezvous"
        procs = [subprocess.Popen(
            [sys.executable, __file__, job, str(rank), str(world_size), rendezvous, backend],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for rank in range(world_size)]
        outputs, failed = [], False
        for proc in procs:
            try:
                out, _ = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                for other in procs:
                    other.kill()
                out, _ = proc.communicate()
                out += f"\n(timed out after {timeout_s} s)"
            outputs.append(out)
            failed |= proc.returncode != 0
    if failed:
        report = "\n".join(f"--- rank {r} ---\n{out}" for r, out in enumerate(outputs))
        raise AssertionError(f"distributed job {job!r} failed on {world_size} ranks:\n{report}")
    return outputs


def _main(job, rank, world_size, rendezvous, backend):
    import torch
    import torch.distributed as dist

    if backend == "nccl":
        torch.cuda.set_device(rank)
    # A rank that fails exits at once; the others then time out of their collectives.
    dist.init_process_group(backend, init_method=rendezvous, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    try:
        import importlib

        module, _, function = job.rpartition(".")
        getattr(importlib.import_module(module or "distributed_checks"), function)()
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    try:
        _main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
