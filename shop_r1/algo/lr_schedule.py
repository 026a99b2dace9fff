"""Learning-rate multipliers: linear warmup, then constant (the paper's RL and SFT) or a cosine decay.

    step < warmup                 (step + 1) / warmup
    constant                      1
    cosine                        FLOOR + (1 - FLOOR) * (1 + cos(pi * progress)) / 2,  progress in [0, 1] after warmup

The cosine ends at FLOOR (10 %) of the peak on the last step, as common SFT recipes do.
"""

from __future__ import annotations

import math

LR_SCHEDULES = ("constant", "cosine")
COSINE_FLOOR = 0.1


def lr_multiplier(step: int, total_steps: int, warmup_steps: int, schedule: str = "constant") -> float:
    """The multiplier of the peak learning rate at optimizer step `step` (from 0) of `total_steps`."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"lr schedule must be one of {LR_SCHEDULES}, got {schedule!r}")
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    decay_steps = max(1, total_steps - max(warmup_steps, 0) - 1)
    progress = min(1.0, max(0.0, (step - max(warmup_steps, 0)) / decay_steps))
    return COSINE_FLOOR + (1 - COSINE_FLOOR) * 0.5 * (1 + math.cos(math.pi * progress))
