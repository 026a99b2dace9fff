"""Numbers stay finite: a step whose rewards, advantages, loss or gradient norm is NaN or infinite is not trained on.

    driver, before the update:   rewards [P, G] -> "reward",  advantages [P, G] -> "advantage"
    learner, before optimizer:   any micro-batch loss -> "loss",  the global gradient norm -> "grad_norm"

A non-finite value skips that update (no optimizer step; the weights stay as they were) and is counted in the step's
metrics by cause (`train/nonfinite_<cause>`). `NonFiniteStreak` ends the run after `rl.max_nonfinite_steps` such
steps in a row, with an error naming the causes: the checkpoints written so far hold finite weights only, because a
skipped update changes nothing and a checkpoint of non-finite weights is refused (`check_weights_finite`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

CAUSES: tuple[str, ...] = ("reward", "advantage", "loss", "grad_norm")


class NonFiniteError(RuntimeError):
    """Training produced NaN or infinite numbers too often, or weights that are not finite."""


def all_finite(values: torch.Tensor) -> bool:
    return bool(torch.isfinite(values).all()) if values.numel() else True


def driver_cause(rewards: torch.Tensor, advantages: torch.Tensor) -> str:
    """The first non-finite quantity the driver holds before an update ("" when both are finite)."""
    if not all_finite(rewards):
        return "reward"
    if not all_finite(advantages):
        return "advantage"
    return ""


def learner_cause(losses: Iterable[float], grad_norm: float | None) -> str:
    """The first non-finite quantity of a learner's update ("" when finite); `grad_norm` None = not measured."""
    if not all(math.isfinite(x) for x in losses):
        return "loss"
    if grad_norm is not None and not math.isfinite(grad_norm):
        return "grad_norm"
    return ""


def metrics(cause: str) -> dict[str, float]:
    """`train/nonfinite_<cause>`: 1.0 for the cause of a skipped update, 0.0 for the others (every step logs all)."""
    if cause and cause not in CAUSES:
        raise ValueError(f"unknown non-finite cause {cause!r} (known: {CAUSES})")
    return {f"train/nonfinite_{c}": float(c == cause) for c in CAUSES}


@dataclass
class NonFiniteStreak:
    """Counts non-finite steps in a row; `observe` raises NonFiniteError once `limit` are reached."""

    limit: int
    where: str = "GRPO"
    run: list[tuple[int, str]] = field(default_factory=list)  # (step, cause) of the current streak

    def observe(self, step: int, cause: str) -> None:
        if not cause:
            self.run.clear()
            return
        self.run.append((step, cause))
        if len(self.run) >= self.limit:
            steps = ", ".join(f"step {s}: {c}" for s, c in self.run)
            raise NonFiniteError(f"{self.where}: {len(self.run)} update(s) in a row skipped for non-finite numbers "
                                 f"({steps}); stopping (rl.max_nonfinite_steps={self.limit}). The last checkpoint "
                                 "holds finite weights: lower the learning rate or check the reward before "
                                 "resuming with --resume")


def nonfinite_names(named: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    """The names of the parameters that hold NaN or inf (a learner reports them before a checkpoint)."""
    return [name for name, t in named if not all_finite(t.detach())]


def check_weights_finite(bad: list[str], where: str, latest: object) -> None:
    """Raise NonFiniteError naming the first (at most 5) non-finite parameters `bad`; nothing when it is empty."""
    if bad:
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise NonFiniteError(f"{where}: non-finite weights in {', '.join(bad[:5])}{more}; refusing to checkpoint "
                             f"them (latest complete checkpoint: {latest})")
