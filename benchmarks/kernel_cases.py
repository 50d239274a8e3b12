"""Named bf16 cases of kernel_phases.py and ncu_target.py: their tensors and launch options."""

from __future__ import annotations

import torch

CASES = {
    # name: (leading shape, d, group size, norm_before_gate, gate sliced from a projection)
    "gdn4096x32-contig": ((4096, 32), 128, 128, True, False),
    "gdn8192x32-contig": ((8192, 32), 128, 128, True, False),
    "gdn8192x32-proj": ((8192, 32), 128, 128, True, True),
    "gdn65536x32-contig": ((65536, 32), 128, 128, True, False),
    "gdn65536x32-proj": ((65536, 32), 128, 128, True, True),
    "mamba2-contig": ((8192,), 5120, 640, False, False),
    "nemotronh-contig": ((8192,), 8192, 1024, False, False),
    "d96": ((524288,), 96, 96, True, False),
    "d1024": ((49152,), 1024, 1024, True, False),
    "d4096": ((12288,), 4096, 4096, True, False),
    "d8192": ((6144,), 8192, 8192, True, False),
    "d16384": ((3072,), 16384, 16384, True, False),
}
# The names the committed Nsight Compute reports were run with.
ALIASES = {"mamba2": "mamba2-contig", "nemotronh": "nemotronh-contig"}


def case_inputs(name: str, device: str = "cuda"):
    """(x, gate, weight, dy, options for gatednorm.kernels.launch) of case ``name``."""
    lead, d, group, norm_before_gate, proj = CASES[ALIASES.get(name, name)]
    dtype = torch.bfloat16
    x = torch.randn(*lead, d, device=device, dtype=dtype)
    if proj:
        # As a model slices it: the middle third of a [tokens, 3 * heads * d] projection.
        width = lead[-1] * d
        projection = torch.randn(lead[0], 3 * width, device=device, dtype=dtype)
        gate = projection[:, width:2 * width].view(x.shape)
    else:
        gate = torch.randn_like(x)
    weight = torch.randn(d, device=device, dtype=dtype)
    dy = torch.randn_like(x)
    options = dict(zero_centered_gamma=False, activation="silu",
                   norm_before_gate=norm_before_gate, group_size=group, rounding="te",
                   traceable=False)
    return x, gate, weight, dy, options
