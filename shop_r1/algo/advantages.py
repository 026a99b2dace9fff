"""Group-relative advantages (GRPO, paper Eq. 4 optimised with Shao et al.'s estimator).

A_i = (r_i - mean(r_group)) / (std(r_group) + eps), std unbiased (n-1), as TRL and verl compute it.
Computed in float64: at DARS-scale totals (~1000) float32's spacing (6e-5) is coarser than the differences the
self-certainty term makes (alpha * s ~ 1e-3 .. 1e-5), which float32 would round away.
A group of one sample, or one whose rewards are all equal, carries no relative signal: its advantages are 0
(it is reported as a zero-signal group and can be dropped from the update).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GroupAdvantages:
    advantages: torch.Tensor  # [P, G] float64
    zero_signal: torch.Tensor  # [P] bool: all rewards in the group equal (or G == 1)

    @property
    def num_zero_signal_groups(self) -> int:
        return int(self.zero_signal.sum())


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> GroupAdvantages:
    """rewards [P, G] (total reward of each sample) -> advantages [P, G]."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [P, G], got shape {tuple(rewards.shape)}")
    rewards = rewards.to(torch.float64)
    num_prompts, group_size = rewards.shape
    if group_size == 1:
        return GroupAdvantages(torch.zeros_like(rewards), torch.ones(num_prompts, dtype=torch.bool))
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)  # unbiased
    zero_signal = (rewards == rewards[:, :1]).all(dim=1)
    adv = (rewards - mean) / (std + eps)
    adv = torch.where(zero_signal.unsqueeze(1), torch.zeros_like(adv), adv)
    return GroupAdvantages(adv, zero_signal)
