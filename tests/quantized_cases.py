"""Hand-made FP8 cases shared by the CPU (interpreter) and GPU suites."""

import torch


def blocks_with_maxima(maxima, rows, device="cpu"):
    """(x, gate, weight, options) whose op output y (fp32) has, in every row, one 128-wide
    block a value of ``maxima``, reached by the first element of each of its 32-wide
    sub-blocks: x = 1 (eps = 0: rstd is exactly 1), a sigmoid gate of 20 (exactly 1 in
    fp32) and no intermediate rounding make y the weight."""
    maxima = torch.tensor(maxima, dtype=torch.float32, device=device)
    position = torch.arange(128, device=device) % 32
    pattern = torch.where(position == 0, 1.0, 1 - position / 64.0)
    weight = (maxima[:, None] * pattern).flatten()
    k = weight.numel()
    x = torch.ones(rows, k, device=device)
    gate = torch.full((rows, k), 20.0, device=device)
    options = dict(group_size=128, eps=0.0, activation="sigmoid", rounding="fp32")
    return x, gate, weight, options


# Block maxima at the edges of the power-of-two scale rules: 448 * 2**e (a scale of exactly
# 2**e) and its fp32 neighbours, mantissas of 1.75 (448's) and one ulp either side, maxima
# whose quotient is subnormal or rounds to 0 (E8M0 exponent 0 below 7 * 2**-144), subnormal
# maxima, the largest finite fp32, infinity and zero.
def scale_rule_edges():
    edges = [0.0, float("inf"), torch.finfo(torch.float32).max, 448.0, 1.0, 2.0**-149,
             223 * 2.0**-149, 224 * 2.0**-149, 225 * 2.0**-149, 2.0**-127, 448 * 2.0**-126,
             448 * 2.0**-127]
    for exponent in (-140, -130, -126, -100, -64, -20, -9, -1, 0, 1, 7, 60, 119, 120):
        value = torch.tensor(448 * 2.0**exponent, dtype=torch.float32)
        if torch.isfinite(value):
            edges += [value.item(), torch.nextafter(value, torch.tensor(0.0)).item(),
                      torch.nextafter(value, torch.tensor(float("inf"))).item()]
    return edges
