"""What the A/B experiment scripts share: L2-cold input sets and the results file."""

from __future__ import annotations

import datetime
import json
import platform

import torch
import triton

from gatednorm.bench import timing

# Input sets rotated through four times the H200's L2 (60 MB), so every timed call is L2-cold.
ROTATED_BYTES = 4 * 60 * 2**20


def cold_input_sets(case, device: torch.device) -> list[tuple[torch.Tensor, ...]]:
    """(x, gate, weight, dy) of ``case``'s inputs for enough seeds to keep the L2 cold,
    detached: the launchers are called directly."""
    sets = max(2, -(-ROTATED_BYTES // case.bytes_allocated()))
    return [tuple(t.detach() for t in (inputs.x, inputs.gate, inputs.weight, inputs.dy))
            for inputs in (case.make_inputs(device, seed) for seed in range(sets))]


def save(result: dict, path: str) -> None:
    """Write the results so far (after each case: a cut-short run keeps what it measured),
    and give the case's inputs' memory back."""
    torch.cuda.empty_cache()
    with open(path, "w") as handle:
        json.dump(result, handle, indent=1)


def new_result(command: str) -> tuple[torch.device, dict]:
    """(device, result): the results file's header (GPU, versions, date, copy bandwidth
    measured now, ``command``) with an empty ``records`` list."""
    device = torch.device("cuda")
    copy_gbps = timing.copy_bandwidth_gbps(device, 1 << 30, timing.FULL)
    print(f"copy {copy_gbps:.0f} GB/s", flush=True)
    return device, dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                        triton=triton.__version__, python=platform.python_version(),
                        date=datetime.date.today().isoformat(), copy_gbps=copy_gbps,
                        command=command, records=[])
